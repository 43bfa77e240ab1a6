"""Replicator-style walk of a Swift device: listdir of every partition, suffix and hash dir.

Run as `python -m bench.walk DEVICE_ROOT`; prints JSON {seconds, dirs, entries}.  It runs
as a subprocess so that it can be placed in the benchmark's memory cgroup (the dentry and
inode caches it fills are charged to it)."""
from __future__ import annotations

import json
import os
import sys
import time


def walk(device: str) -> dict:
    t0 = time.perf_counter()
    dirs = entries = files = 0
    objs = os.path.join(device, "objects")
    parts = os.listdir(objs)
    dirs += 1
    entries += len(parts)
    for p in parts:
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
    return {"seconds": time.perf_counter() - t0, "dirs": dirs, "entries": entries, "files": files}


if __name__ == "__main__":
    print(json.dumps(walk(sys.argv[1])))
