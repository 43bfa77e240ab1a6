"""`python -m bench.getsteps WORKDIR [--objects N] [--gets N] -o OPTS [-o OPTS ...]`: the
file part of a cold Swift GET on packfs, system call by system call, under each set of
mount options.

It makes a packfs mount (on an XFS loop image, as `make bench`'s), builds N objects of 4
KiB through it, then for each option set remounts and, twice: drops the caches and times
what Swift's object server does for a GET (list the hash directory, open the .data file,
read its metadata xattr, fstat, read, close) on the same sample of objects; then drops
them again, reads the volumes into the page cache, and times the sample again (the
record cached, the kernel's inodes cold). Last, the median time of a 4 KiB O_DIRECT read
of the loop device: what the disk itself costs. Medians in µs, one line per round.
"""
from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import swiftobj as so
from .scale import build_objects
from .testbed import Testbed
from .util import drop_caches, log

STEPS = ("listdir", "open", "getxattr", "fstat", "read", "close")


def timed_gets(device: Path, names: list[str]) -> dict[str, float]:
    """Median µs of each system call of a GET's file part, over the objects named."""
    took: dict[str, list[float]] = {step: [] for step in (*STEPS, "all")}
    for name in names:
        part, h = so.object_location(name)
        hdir = f"{device}/objects/{part}/{h[-3:]}/{h}"
        t = [time.perf_counter()]
        files = os.listdir(hdir)
        t.append(time.perf_counter())
        fd = os.open(f"{hdir}/{files[0]}", os.O_RDONLY)
        t.append(time.perf_counter())
        os.getxattr(fd, "user.swift.metadata")
        t.append(time.perf_counter())
        os.fstat(fd)
        t.append(time.perf_counter())
        os.read(fd, 65536)
        t.append(time.perf_counter())
        os.close(fd)
        t.append(time.perf_counter())
        for step, a, b in zip(STEPS, t, t[1:]):
            took[step].append((b - a) * 1e6)
        took["all"].append((t[-1] - t[0]) * 1e6)
    return {step: statistics.median(v) for step, v in took.items()}


def device_read_us(dev: str, span: int, reads: int = 400) -> float:
    """Median µs of a random 4 KiB O_DIRECT read of the first `span` bytes of a device."""
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    rng = random.Random(2)
    took = []
    try:
        for _ in range(reads):
            t0 = time.perf_counter()
            os.preadv(fd, [buf], rng.randrange(span // 4096) * 4096)
            took.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
    return statistics.median(took)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.getsteps", description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="where the pack's image and the mount go")
    ap.add_argument("--objects", type=int, default=20_000)
    ap.add_argument("--gets", type=int, default=400, help="objects in the sample")
    ap.add_argument("-o", dest="options", action="append", required=True, help="mount options (repeat)")
    a = ap.parse_args(argv)
    names = [f"obj-{i}" for i in random.Random(1).sample(range(a.objects), a.gets)]
    with Testbed(a.work, 8, fs_names=("packfs",)) as tb:
        t = tb.targets["packfs"]
        build_objects(str(t.mnt), 0, a.objects, 4096, f"{time.time() - 3600:016.5f}", "getsteps")
        for opts in a.options:
            t.umount()
            t.packfs_opts = opts
            t.mount()
            for _ in range(2):
                for cached in (False, True):
                    drop_caches()
                    if cached:
                        for v in sorted((t.packdir / "volumes").iterdir()):
                            subprocess.run(["cat", v], stdout=subprocess.DEVNULL, check=True)
                    med = timed_gets(t.mnt, names)
                    what = "records cached" if cached else "cold"
                    print(f"-o {opts:28s} {what:15s} " + " ".join(f"{k} {v:.0f}" for k, v in med.items()),
                          flush=True)
        drop_caches()
        print(f"a 4 KiB O_DIRECT read of {t.loop}: {device_read_us(t.loop, 200 << 20):.0f} µs", flush=True)
    log("getsteps: medians in µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
