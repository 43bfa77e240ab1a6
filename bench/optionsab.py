"""Mount options compared under one stock Swift object server, rounds rotated.

Each round mounts a fresh pack once per configuration, in an order that rotates from
round to round, starts an object server on it, and measures objects of --size bytes
(4 KiB by default): PUT at concurrency 1 (p50), PUT at concurrency 16 (ops/s), GET of
those at concurrency 16 (ops/s), DELETE at concurrency 1 (p50), and the host's CPU steal
meanwhile (steal.py). The medians of the rounds come last, with each configuration's
steal over its rounds: two configurations whose steal differs by several points were
not measured alike. Where `make bench` compares packfs with XFS, this
compares packfs with itself, for a change that has an option (docs/bench-latest.md):

    python -m bench.optionsab default= old=notmpfile,nofallocate [--rounds 3] [--size N] [--dir D]

Each argument is NAME=OPTIONS (OPTIONS may be empty). The packs go under --dir (default
/var/tmp/packfs-optionsab), which is removed at the end.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

from . import steal
from . import swiftobj as so
from .util import REPO

sys.path.insert(0, str(REPO / "tests"))
from mounts import mounted  # noqa: E402


def one(base: Path, options: str, tag: str, puts: int, size: int) -> tuple[float, float, float, float]:
    """(PUT c1 p50 ms, PUT c16 ops/s, GET c16 ops/s, DELETE c1 p50 ms) on a fresh pack with
    these options."""
    shutil.rmtree(base, ignore_errors=True)
    devices = base / "devices"
    with mounted(base / "pack", devices / so.DEVICE, options):
        srv = so.ObjectServer(tag, devices, base / "swift")
        srv.start()
        try:
            so.run_phase(srv.port, "PUT", [f"warm{i}" for i in range(50)], 4096, 1, 30)
            names = [f"{tag}-a{i}" for i in range(puts)]
            c1 = so.run_phase(srv.port, "PUT", names, size, 1, 120).summary()
            many = [f"{tag}-b{i}" for i in range(2 * puts)]
            c16 = so.run_phase(srv.port, "PUT", many, size, 16, 120).summary()
            g16 = so.run_phase(srv.port, "GET", many, size, 16, 120).summary()
            d1 = so.run_phase(srv.port, "DELETE", names, 0, 1, 120).summary()
        finally:
            srv.stop()
    for phase in (c1, c16, g16, d1):
        if phase["errors"]:
            raise RuntimeError(f"{tag}: {phase['errors']} errors: {phase['first_error']}")
    return c1["p50"], c16["ops_s"], g16["ops_s"], d1["p50"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="NAME=OPTIONS, at least two")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--puts", type=int, default=1500, help="PUTs at c1 per round (twice as many at c16)")
    ap.add_argument("--size", type=int, default=4096, help="object size in bytes")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/packfs-optionsab"))
    a = ap.parse_args()
    configs = dict(c.partition("=")[::2] for c in a.configs)
    if len(configs) < 2:
        ap.error("give at least two configurations")
    got: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in configs}
    meter = steal.Meter()
    try:
        for r in range(a.rounds):
            k = r % len(configs)
            for name in list(configs)[k:] + list(configs)[:k]:
                started = meter.start()
                p1, ops, gets, d1 = one(a.dir, configs[name], f"r{r}{name}", a.puts, a.size)
                stolen = meter.stop(name, f"round {r + 1}", started)
                got[name].append((p1, ops, gets, d1))
                print(f"round {r + 1}/{a.rounds} {name:14s} PUT c1 p50 {p1:.3f} ms, PUT c16 {ops:.0f} ops/s, "
                      f"GET c16 {gets:.0f} ops/s, DELETE c1 p50 {d1:.3f} ms, steal {stolen:.1f}%", flush=True)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    for name, rows in got.items():
        if rows:
            print(f"{name:14s} medians of {len(rows)}: PUT c1 p50 {statistics.median(r[0] for r in rows):.3f} ms, "
                  f"PUT c16 {statistics.median(r[1] for r in rows):.0f} ops/s, "
                  f"GET c16 {statistics.median(r[2] for r in rows):.0f} ops/s, "
                  f"DELETE c1 p50 {statistics.median(r[3] for r in rows):.3f} ms, "
                  f"steal {meter.by_fs[name].pct:.1f}%")


if __name__ == "__main__":
    main()
