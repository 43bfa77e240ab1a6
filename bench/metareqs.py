"""Which FUSE requests a packfs mount's Python handlers serve, per walked directory and per
Swift GET, and which its fuse shim answers in C (issue 52's table).

    python -m bench.metareqs PACKDIR WORKDIR [--objects 20000] [--gets 300] [-o OPTIONS]

It mounts PACKDIR at WORKDIR/devices/sdb1 (a fresh pack directory is filled with Swift
objects made as bench/scale.py's builder makes them, through the mount), then:

- `walk`, `walk_again`: drops the kernel's caches (root) and walks the device as Swift's
  replicator lists it (bench.walk), timed, twice (under relatime the first walk after a
  change sets each directory's atime);
- `get`: drops the caches again and GETs `--gets` distinct objects through a stock
  object server (bench.swiftobj), one at a time;
- `get_syscalls`: the same objects, warm, with the system calls of a GET's file part
  (stat, open, fgetxattr of the metadata and its checksum, fstat, read, close).

For each it prints the requests per directory (or per GET) from `packfs stats`: the ones
Python served (`python`, by operation) and the ones the shim answered (`in_shim`), as JSON.
Nothing here changes the mount's options: give them with -o to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from multiprocessing import Value
from pathlib import Path

from bench import swiftobj as so
from bench.scale import _build_worker
from bench.walk import walk
from packfs.stats import ANSWERED_IN_SHIM
from tests import mounts


def _counts(mountpoint: Path) -> tuple[dict[str, int], dict[str, int]]:
    s = mounts.stats(mountpoint)
    python = {op: v["count"] for op, v in s["operations"].items()}
    shim: dict[str, int] = {}
    for op, field in ANSWERED_IN_SHIM:
        shim[op] = shim.get(op, 0) + s.get(field, 0)
    return python, shim


def _per(before: tuple[dict, dict], after: tuple[dict, dict], n: int) -> dict:
    out = {}
    for name, b, a in (("python", *[x[0] for x in (before, after)]), ("in_shim", *[x[1] for x in (before, after)])):
        delta = {op: a.get(op, 0) - b.get(op, 0) for op in a}
        out[name] = {op: round(d / n, 3) for op, d in sorted(delta.items()) if d}
        out[name + "_total"] = round(sum(delta.values()) / n, 3)
        out[name + "_requests"] = sum(delta.values())
    return out


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("2\n")


def _syscall_get(path: str) -> None:
    os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.getxattr(fd, "user.swift.metadata")
        try:
            os.getxattr(fd, "user.swift.metadata1")
        except OSError:
            pass
        try:
            os.getxattr(fd, "user.swift.metadata_checksum")
        except OSError:
            pass
        os.fstat(fd)
        os.read(fd, 65536)
    finally:
        os.close(fd)


def measure(packdir: Path, work: Path, objects: int, gets: int, options: str) -> dict:
    device = work / "devices" / so.DEVICE
    fresh = not packdir.exists()
    result: dict = {"objects": objects, "options": options}
    with mounts.mounted(packdir, device, options):
        names = [f"obj-{i}" for i in range(objects)]
        if fresh:
            t = time.monotonic()
            _build_worker(str(device), 0, 1, objects, 4096, "1700000000.00000", Value("q", 0))
            result["build_seconds"] = round(time.monotonic() - t, 1)
        for run in ("walk", "walk_again"):  # (under relatime the first sets every directory's atime)
            _drop_caches()
            before = _counts(device)
            w = walk(str(device))
            result[run] = {"dirs": w["dirs"], "us_per_dir": round(w["seconds"] / w["dirs"] * 1e6, 1),
                           **_per(before, _counts(device), w["dirs"])}
        server = so.ObjectServer("metareqs", work / "devices", work / "swift")
        server.start()
        try:
            picked = names[:: max(1, objects // gets)][:gets]
            _drop_caches()
            before = _counts(device)
            for name in picked:
                so.timed_get(server.port, name)
            result["get"] = _per(before, _counts(device), len(picked))
        finally:
            server.stop()
        paths = []
        for name in picked:
            part, h = so.object_location(name)
            paths.append(f"{device}/objects/{part}/{h[-3:]}/{h}/1700000000.00000.data")
        before = _counts(device)
        for p in paths:
            _syscall_get(p)
        result["get_syscalls"] = _per(before, _counts(device), len(paths))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packdir", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--objects", type=int, default=20000)
    ap.add_argument("--gets", type=int, default=300)
    ap.add_argument("-o", "--options", default="")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    out = measure(args.packdir, args.work, args.objects, args.gets, args.options)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, **out},
                     indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
