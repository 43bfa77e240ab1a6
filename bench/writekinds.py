"""Where each disk write of a Swift PUT goes: `python -m bench.writekinds [--puts N] [--conc C,...]`.

Group commit is judged by disk writes per PUT, and a count alone does not say what to
cut. This traces every request the device under test is sent (the kernel's
`block_rq_issue` event, in an ftrace instance of its own) while stock Swift's object
server takes PUTs of small objects, and sorts the writes by where they land: the
filesystem's journal (XFS's log), packfs's volume files (its own log writes, counted by
`packfs stats`, and the rest: preallocated zeros, large writes split into requests), its
catalog, and everything else (XFS's inodes, directories and free-space btrees), plus the
flushes that carry no data. Runs on the disk model of BENCH_DISK (bench/diskmodel.py)
against a fresh packfs (on XFS) and a fresh XFS; each concurrency level starts after a
warm-up and a remount, so that packfs's group-commit counts are its own.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

from . import diskmodel
from . import swiftobj as so
from .testbed import Target, Testbed
from .util import log, run

TRACEFS = Path("/sys/kernel/tracing")
INSTANCE = "packfs-writekinds"
_RQ = re.compile(r"block_rq_issue: (\d+),(\d+) (\w+) \d+ \(.*?\) (\d+) \+ (\d+)")
_BMAP = re.compile(r"\s*\d+:\s+\[\d+\.\.\d+\]:\s+(\d+)\.\.(\d+)")


@contextlib.contextmanager
def traced(dev: str) -> Iterator[Path]:
    """The requests issued to dev while the block runs: yields the trace file to read
    before leaving it. Mounts tracefs if needed and removes everything it made."""
    mounted = False
    if not (TRACEFS / "instances").exists():
        run(["mount", "-t", "tracefs", "nodev", TRACEFS])
        mounted = True
    inst = TRACEFS / "instances" / INSTANCE
    try:
        if inst.exists():
            inst.rmdir()  # left by an interrupted run
        inst.mkdir()
        st = os.stat(dev).st_rdev
        event = inst / "events" / "block" / "block_rq_issue"
        (event / "filter").write_text(f"dev == {(os.major(st) << 20) | os.minor(st)}\n")  # the kernel's dev_t
        (inst / "buffer_size_kb").write_text("65536\n")
        (event / "enable").write_text("1\n")
        yield inst / "trace"
    finally:
        if inst.exists():
            (inst / "events" / "block" / "block_rq_issue" / "enable").write_text("0\n")
            inst.rmdir()
        if mounted:
            run(["umount", TRACEFS], check=False)


def xfs_regions(dev: str, packdir: Path | None) -> dict[str, list[tuple[int, int]]]:
    """Sector spans of XFS's log, and of each kind of file in packfs's PACKDIR."""
    sb = dict(re.findall(r"(\w+) = (\d+)", run(["xfs_db", "-r", "-c", "sb 0", "-c",
                                                 "print logstart logblocks blocksize", dev]).stdout))
    out = run(["xfs_db", "-r", "-c", f"convert fsb {sb['logstart']} daddr", dev]).stdout
    start = int(out.split("(")[1].split(")")[0])
    spans = {"XFS log": [(start, start + int(sb["logblocks"]) * int(sb["blocksize"]) // 512)]}
    for p in sorted(packdir.rglob("*")) if packdir else []:
        if p.is_file():
            kind = "packfs volumes" if p.suffix == ".pack" else "packfs catalog" if "catalog" in p.name else "other"
            for line in run(["xfs_bmap", "-v", p]).stdout.splitlines():
                m = _BMAP.match(line)
                if m:
                    spans.setdefault(kind, []).append((int(m.group(1)), int(m.group(2)) + 1))
    return spans


def classify(trace: str, spans: dict[str, list[tuple[int, int]]]) -> collections.Counter:
    """Requests by kind: writes by the region they land in, and flushes without data."""
    kinds: collections.Counter = collections.Counter()
    for m in _RQ.finditer(trace):
        rwbs, sector, count = m.group(3), int(m.group(4)), int(m.group(5))
        if "W" not in rwbs:
            kinds["flushes without data" if rwbs.startswith("F") else "reads"] += 1
            continue
        if count == 0:
            kinds["flushes without data"] += 1
            continue
        kind = next((k for k, ss in spans.items() if any(a <= sector < b for a, b in ss)), None)
        kinds[kind or "XFS metadata in place, other data"] += 1
    return kinds


def _settle(dev: str, quiet: float = 2.0, limit: float = 120.0) -> None:
    """Wait until dev has written nothing for `quiet` seconds: the warm-up's background
    work is not counted as the PUTs'."""
    deadline = time.monotonic() + limit
    last = diskmodel.io_count(dev).writes
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = diskmodel.io_count(dev).writes
        if now == last:
            return
        last = now
    log(f"writekinds: {dev} still writing after {limit:.0f} s; measuring anyway")


def measure(t: Target, srv: so.ObjectServer, model: diskmodel.DiskModel, conc: int, puts: int,
            first: int) -> tuple[so.Phase, collections.Counter, dict | None]:
    """Remount, warm up, then `puts` PUTs of 64 B at `conc`, traced and (hdd) throttled.
    The warm-up (200 PUTs at `conc`) makes packfs prepare its log's space again, which a
    mount leaves to the first write (recovery cuts the log at its end), and is in its
    group-commit figures (counted from the mount)."""
    subprocess.run(["sync"], check=True)
    t.umount()
    t.mount()
    so.run_phase(srv.port, "PUT", [f"warm-{conc}-{i}" for i in range(200)], 64, conc, 600)
    _settle(t.loop)
    names = [f"obj-{i}" for i in range(first, first + puts)]
    before = t.stats()
    with diskmodel.throttled(model, [t.loop]), traced(t.loop) as trace:
        ph = so.run_phase(srv.port, "PUT", names, 64, conc, 900)
        subprocess.run(["sync"], check=True)
        text = trace.read_text()
    stats = t.stats()
    kinds = classify(text, xfs_regions(t.loop, t.packdir))
    if stats and before and "packfs volumes" in kinds:
        log_writes = stats["device_writes"] - before["device_writes"]
        kinds["packfs volumes: other writes (zeros, splits)"] = max(0, kinds.pop("packfs volumes") - log_writes)
        kinds["packfs volumes: log writes"] = log_writes
    return ph, kinds, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puts", type=int, default=600, help="measured PUTs per case (600)")
    ap.add_argument("--conc", default="1,16", help="client concurrencies, comma-separated (1,16)")
    ap.add_argument("--fs", default="packfs,xfs", help="filesystems: packfs, xfs (both)")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/packfs-writekinds"), help="images and mounts")
    a = ap.parse_args()
    model = diskmodel.from_env()
    diskmodel.check_available(model)
    try:
        concs = [int(c) for c in a.conc.split(",")]
    except ValueError:
        raise SystemExit(f"bench.writekinds: --conc {a.conc!r}: give numbers such as 1,16") from None
    fs_names = [f for f in a.fs.split(",") if f]
    if not set(fs_names) <= {"packfs", "xfs"}:
        raise SystemExit(f"bench.writekinds: --fs {a.fs!r}: choose from packfs, xfs")
    print(f"disk model: {model.describe()}")
    with Testbed(a.work, 8, fs_names) as tb:
        for t in tb:
            srv = so.ObjectServer(t.name, t.devices, a.work / "swift" / t.name)
            srv.start()
            try:
                for i, conc in enumerate(concs):
                    log(f"writekinds: {t.name} c{conc}, {a.puts} PUTs of 64 B")
                    ph, kinds, stats = measure(t, srv, model, conc, a.puts, i * a.puts)
                    _print(t.name, conc, ph, kinds, stats)
            finally:
                srv.stop()
    return 0


def _print(name: str, conc: int, ph: so.Phase, kinds: collections.Counter, stats: dict | None) -> None:
    n = max(1, ph.ops)
    writes = sum(v for k, v in kinds.items() if k not in ("reads", "flushes without data"))
    print(f"\n{name} c{conc}: {ph.ops} PUTs, {ph.rate:.1f}/s, {ph.errors} errors; "
          f"{writes / n:.2f} writes a PUT")
    for kind, count in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:45s} {count:7d}  {count / n:6.2f} a PUT")
    if stats:
        g = stats["group_commit"]
        print(f"  packfs group commit: {g['flushes']} flushes ({stats['device_flushes_on_loop']} by a lone fsync "
              f"on the loop); per flush: commits {g['commits_per_flush']}, files {g['files_per_flush']}, "
              f"log writes {g['writes_per_flush']}")


if __name__ == "__main__":
    raise SystemExit(main())
