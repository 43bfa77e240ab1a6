"""How long one request waits while the filesystem does bulk work: a probe thread calls
`listxattr` on a file every millisecond or two beside a workload, and reports its
latencies. On packfs every request is served by one event loop, so whatever holds the
loop (a commit's or a checkpoint's snapshot, `packfs stats` counting the inode table)
shows here as the longest wait; on XFS or ext4 the same command gives the baseline.

    python -m bench.stalls DIR fsync   [--files N]  # 4 writers: create, 8 KiB, setxattr, fsync, rename
    python -m bench.stalls DIR nofsync [--files N]  # 2 writers: 4 KiB files, Swift-like tree, no fsync
    python -m bench.stalls DIR stats                # `packfs stats` 10 times on what is there

Prints one JSON line: files/s (writers), the probe's samples, p50, p99 and max in ms, and
every wait over 50 ms with its time since the start. Run it on an empty directory of the
mount; `stats` after one of the others.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable

SLOW = 0.05  # s: waits reported one by one


def _fsync_writer(root: str, files: int, k: int, of: int) -> None:
    for i in range(k, files, of):
        h = hashlib.md5(str(i).encode()).hexdigest()
        d = os.path.join(root, "objects", str(i % 256), h[-3:], h)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "1700000000.%05d.data" % i)
        fd = os.open(path + ".tmp", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"x" * 8192)
            os.setxattr(fd, "user.swift.metadata", b"m" * 300)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(path + ".tmp", path)


def _plain_writer(root: str, files: int, k: int, of: int) -> None:
    for i in range(k, files, of):
        suffix, name = "%03x" % (i * 7919 % 4096), "%032x" % (i * 2654435761)
        d = os.path.join(root, "objects", str(i % 1024), suffix, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i}.data"), "wb") as f:
            f.write(b"x" * 4096)
            os.setxattr(f.fileno(), "user.swift.metadata", b"m" * 300)


def _writers(fn: Callable[[str, int, int, int], None], n: int) -> Callable[[str, int], None]:
    def run(root: str, files: int) -> None:
        threads = [threading.Thread(target=fn, args=(root, files, k, n)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return run


def _stats(root: str, _: int) -> None:
    for _ in range(10):
        subprocess.run([sys.executable, "-m", "packfs.cli", "stats", root], check=True, capture_output=True)
        time.sleep(0.2)


WORKLOADS = {"fsync": _writers(_fsync_writer, 4), "nofsync": _writers(_plain_writer, 2), "stats": _stats}


def measure(root: str, workload: str, files: int) -> dict:
    probe = os.path.join(root, "probe")
    open(probe, "a").close()
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def prober() -> None:
        while not done.is_set():
            t = time.perf_counter()
            os.listxattr(probe)
            samples.append((t, time.perf_counter() - t))
            time.sleep(0.001)

    p = threading.Thread(target=prober)
    p.start()
    t0 = time.perf_counter()
    try:
        WORKLOADS[workload](root, files)
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        p.join()
    waits = sorted(d for _, d in samples)
    out = {"workload": workload, "seconds": round(seconds, 1), "probes": len(waits),
           "p50_ms": round(waits[len(waits) // 2] * 1000, 3),
           "p99_ms": round(waits[int(len(waits) * 0.99)] * 1000, 2), "max_ms": round(waits[-1] * 1000, 1),
           "over_50ms": [(round(t - t0, 1), round(d * 1000)) for t, d in samples if d > SLOW]}
    if workload != "stats":
        out["files_per_s"] = round(files / seconds)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stalls", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="an empty directory on the filesystem to measure")
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--files", type=int, default=80_000, help="files the writers create (default 80,000)")
    a = ap.parse_args()
    print(json.dumps(measure(a.root, a.workload, a.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
