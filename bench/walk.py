"""Replicator-style walk of a Swift device: listdir of every partition, suffix and hash dir.

Run as `python -m bench.walk DEVICE_ROOT [LIMIT_SECONDS]`; prints JSON {seconds, dirs,
entries, files, complete}. It runs as a subprocess so that it can be placed in the
benchmark's memory cgroup (the dentry and inode caches it fills are charged to it). With
a limit it stops after the partition in which the limit passed (complete: false): on the
modelled hard disk a cold walk of ext4 at 100,000 objects ran at 14.5-17 directories/s:
its 201,046 directories would take about four hours."""
from __future__ import annotations

import json
import os
import sys
import time


def walk(device: str, limit: float = 0.0) -> dict:
    t0 = time.perf_counter()
    complete = True
    dirs = entries = files = 0
    objs = os.path.join(device, "objects")
    parts = os.listdir(objs)
    dirs += 1
    entries += len(parts)
    for p in parts:
        if limit and time.perf_counter() - t0 > limit:
            complete = False
            break
        if not p.isdigit():
            continue
        pdir = os.path.join(objs, p)
        suffixes = os.listdir(pdir)
        dirs += 1
        entries += len(suffixes)
        for s in suffixes:
            if len(s) != 3:
                continue  # hashes.pkl, hashes.invalid, .lock
            sdir = os.path.join(pdir, s)
            hashes = os.listdir(sdir)
            dirs += 1
            entries += len(hashes)
            for h in hashes:
                names = os.listdir(os.path.join(sdir, h))
                dirs += 1
                entries += len(names)
                files += len(names)
    return {"seconds": time.perf_counter() - t0, "dirs": dirs, "entries": entries, "files": files,
            "complete": complete}


if __name__ == "__main__":
    print(json.dumps(walk(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)))
