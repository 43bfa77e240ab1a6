"""How long another thread waits while a worker thread writes one catalog checkpoint.

The daemon writes its checkpoints in a worker thread while the event loop's thread
serves every request; whatever the worker does holding the GIL, the loop waits for.
This writes three checkpoints of ROWS inode rows each (Swift-like files with ~120 B of
metadata) into a fresh catalog in DIR, while the main thread sleeps 1 ms at a time, and
prints each checkpoint's time and the main thread's longest sleep, as JSON:

    python -m bench.commitgap DIR [--rows 200000]

A sleep far over 1 ms is the GIL held: apsw's `with connection` committed holding it
(77-89 ms at 200,000 rows on this VM's root disk; docs/bench-latest.md).
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import threading
import time

from packfs.core.catalog import Catalog
from packfs.namespace.xattrblob import pack_xattrs


def checkpoint_gap(cat: Catalog, first: int, rows: int) -> dict:
    """One checkpoint of `rows` new inodes from `first` on; its time and the longest sleep."""
    xattrs = pack_xattrs({b"user.swift.metadata": os.urandom(120)})
    batch = [(ino, stat.S_IFREG | 0o644, 0, 0, 1, 4096, 1, 2, 3, 0, None, xattrs, None, 1)
             for ino in range(first, first + rows)]
    worker = threading.Thread(target=cat.checkpoint, args=(batch, [], [], [], {"next_ino": first + rows}))
    longest, start = 0.0, time.perf_counter()
    worker.start()
    while worker.is_alive():
        t = time.perf_counter()
        time.sleep(0.001)
        longest = max(longest, time.perf_counter() - t)
    worker.join()
    return {"checkpoint_ms": round((time.perf_counter() - start) * 1e3, 1), "longest_sleep_ms": round(longest * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="an empty or missing directory on the disk to measure")
    ap.add_argument("--rows", type=int, default=200_000, help="inode rows per checkpoint")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "catalog.sqlite")
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: give an empty directory")
    cat = Catalog(path, create=True)
    try:
        cat.initialise(1)
        print(json.dumps([checkpoint_gap(cat, 2 + i * args.rows, args.rows) for i in range(3)]))
    finally:
        cat.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)


if __name__ == "__main__":
    main()
