"""Where a Swift-like 4 KiB PUT's time goes, system call by system call, on any directory.

One thread does what Swift's object server does to store an object, N times: create a
temporary file, write 4 KiB, set its metadata xattr, fsync it, make the hash directory
(and the suffix directory when new), rename the file into it, fsync the hash and the
suffix directory. It prints the mean time per PUT of each step, in ms, as JSON:

    python -m bench.putsteps DIR [--puts 1000]

Run it on packfs and on XFS or ext4 to see which steps a FUSE round trip makes dearer
(docs/bench-latest.md). DIR must be empty or missing; what it writes stays there.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from typing import Any, Callable


def put_steps(root: str, puts: int) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)

    def timed(step: str, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        result = fn(*args)
        spent[step] += time.perf_counter() - t
        return result

    tmp = os.path.join(root, "objects", "tmp")
    os.makedirs(tmp)
    start = time.perf_counter()
    for i in range(puts):
        hashdir = os.path.join(root, "objects", str(i % 64), "%03x" % (i % 4096), "%032x" % i)
        temp = os.path.join(tmp, f"t{i}")
        fd = timed("create", os.open, temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        timed("write", os.write, fd, b"x" * 4096)
        timed("setxattr", os.setxattr, fd, "user.swift.metadata", b"m" * 250)
        timed("fsync", os.fsync, fd)
        timed("makedirs", os.makedirs, hashdir, 0o755, True)
        timed("rename", os.rename, temp, os.path.join(hashdir, "1700000000.%05d.data" % i))
        for d in (hashdir, os.path.dirname(hashdir)):
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            timed("fsyncdir", os.fsync, dfd)
            os.close(dfd)
        timed("close", os.close, fd)
    spent["put"] = time.perf_counter() - start
    return {step: round(s / puts * 1e3, 3) for step, s in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="an empty or missing directory on the filesystem to measure")
    ap.add_argument("--puts", type=int, default=1000)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if os.listdir(args.dir):
        raise SystemExit(f"{args.dir} is not empty")
    print(json.dumps(put_steps(args.dir, args.puts)))


if __name__ == "__main__":
    main()
