"""How long a request waits while the kernel gives back the references of evicted inodes.

A cold walk leaves the kernel holding a reference to every inode it listed; when the
kernel evicts them (`drop_caches`, memory pressure) it sends them back to the daemon as
a stream of FORGET requests. This stats every file under DIR (so the kernel holds
them), then times a `getxattr` of one file every 2 ms for 3 s while `drop_caches` (2:
dentries and inodes) evicts them, and prints the waits and the daemon's RSS before and
after, as JSON:

    python -m bench.forgetstall DIR --build 300000   # once: DIR/dNNN/fNN files and DIR/probe
    python -m bench.forgetstall DIR [--pid PID]       # PID: the daemon, for its RSS

DIR is a packfs mount (or any directory); root is needed for `drop_caches`. Applied in
the FORGET handler an entry at a time, 300,000 files' references held a getxattr up to
561 ms; applied in one pass over the columns, 9.4 ms (docs/architecture.md).
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

PROBE = "probe"


def build(root: str, files: int) -> None:
    """files empty files, 100 per directory, and the probe file with an xattr."""
    for d in range(files // 100):
        os.makedirs(os.path.join(root, f"d{d}"), exist_ok=True)
        for f in range(100):
            open(os.path.join(root, f"d{d}", f"f{f}"), "wb").close()
    probe = os.path.join(root, PROBE)
    open(probe, "wb").close()
    os.setxattr(probe, "user.x", b"1")


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def measure(root: str, pid: int | None) -> dict:
    held = 0
    for d in os.listdir(root):
        if d.startswith("d"):
            for f in os.listdir(os.path.join(root, d)):
                os.stat(os.path.join(root, d, f))
                held += 1
    rss_before = rss_kib(pid)
    waits: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        path = os.path.join(root, PROBE)
        while not stop.is_set():
            t = time.perf_counter()
            os.getxattr(path, "user.x")
            waits.append(time.perf_counter() - t)
            time.sleep(0.002)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.3)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
    time.sleep(3)
    stop.set()
    thread.join()
    waits.sort()
    after = rss_kib(pid)
    return {"files_held": held, "getxattrs": len(waits),
            "p50_ms": round(waits[len(waits) // 2] * 1e3, 2), "p99_ms": round(waits[int(len(waits) * 0.99)] * 1e3, 2),
            "max_ms": round(waits[-1] * 1e3, 2),
            "rss_before_mib": None if rss_before is None else round(rss_before / 1024, 1),
            "rss_after_mib": None if after is None else round(after / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--build", type=int, metavar="FILES", help="make the files to hold, then stop")
    ap.add_argument("--pid", type=int, help="the daemon's PID, for its RSS before and after")
    args = ap.parse_args()
    if args.build:
        build(args.dir, args.build)
    else:
        print(json.dumps(measure(args.dir, args.pid)))


if __name__ == "__main__":
    main()
