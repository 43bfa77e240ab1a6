"""`python -m bench [--quick] PART...`: run benchmark parts side by side on packfs, XFS, ext4.

PART is fio, swift, scale, or all (the default); swift-large runs only the swift part's
large-object PUTs and GET (1 GiB, 128 MiB with QUICK), to compare mount options for large
objects; `report` only re-renders the table from the JSON files already in the output
directory.  Environment (used by mk/bench.mk):

  QUICK=1                 small sizes, finishes in under 10 minutes
  BENCH_REPS=N            repetitions (default 3; 2 with QUICK)
  BENCH_WORK=DIR          where images, mounts and servers live (default /var/tmp/packfs-bench)
  BENCH_OUT=DIR           results (default bench-results)
  BENCH_FS=a,b            filesystems (default packfs,xfs,ext4)
  BENCH_PACKFS_OPTS=...   -o options for `packfs mount`
  BENCH_PACKFS_BACKING=xfs|ext4   filesystem of packfs's PACKDIR image (default xfs)
  BENCH_OBJECTS=N         objects for the scale part (default 1,000,000; 20,000 with QUICK)
  BENCH_SWIFT_WORKERS=N   object server worker processes (default 1; Swift's own default is auto, one per core)
  BENCH_SWIFT_NETWORK_CHUNK=N   the object server's network_chunk_size, the size of a PUT's writes (default
                          65536, Swift's)
  BENCH_HALT_POLL_NS=N    the guest's halt polling for the run (default: as the machine has it; bench/haltpoll.py)
  BENCH_DISK=fast|hdd     the disk model (bench/diskmodel.py): this machine's disk, or one 7200 rpm drive
                          (BENCH_HDD_IOPS=150, BENCH_HDD_MBPS=160, BENCH_HDD_SEEK_MS=8.3); hdd results go to
                          BENCH_OUT/hdd
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import diskmodel, haltpoll
from . import report as rep
from .results import Results, load
from .testbed import FS_ORDER, Testbed, packfs_available
from .util import REPO, log

PARTS = ("fio", "swift", "scale")
EXTRA_PARTS = ("swift-large",)  # run only when named, never by "all"


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0", "no", "false")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("parts", nargs="*", default=["all"])
    ap.add_argument("--quick", action="store_true", default=_env_bool("QUICK"))
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "0")) or None)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT", REPO / "bench-results")))
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("BENCH_WORK", "/var/tmp/packfs-bench")))
    ap.add_argument("--fs", default=os.environ.get("BENCH_FS", ",".join(FS_ORDER)))
    ap.add_argument("--objects", type=int, default=int(os.environ.get("BENCH_OBJECTS", "0")) or None)
    a = ap.parse_args(argv)

    parts = list(PARTS) if "all" in a.parts else a.parts
    model = diskmodel.from_env()
    if model.throttled:
        a.out = a.out / "hdd"
    if parts == ["report"]:
        found = [load(p) for p in (a.out / f"{x}.json" for x in PARTS) if p.exists()]
        print(rep.report(a.out, found))
        return 0
    for p in parts:
        if p not in PARTS + EXTRA_PARTS:
            ap.error(f"unknown part {p!r}; choose from {', '.join(PARTS + EXTRA_PARTS)}, all, report")
    if os.geteuid() != 0:
        print("bench: must run as root (loop devices, mounts, drop_caches, cgroups)", file=sys.stderr)
        return 2

    diskmodel.check_available(model)
    reps = a.reps or (2 if a.quick else 3)
    fs_names = [f.strip() for f in a.fs.split(",") if f.strip()]
    notes = []
    if "packfs" in fs_names and not packfs_available():
        notes.append("packfs was not measured: `python -m packfs.cli mount` is not available yet.")
        log("WARNING: packfs CLI not available; running XFS and ext4 only")
        fs_names.remove("packfs")
    a.out.mkdir(parents=True, exist_ok=True)
    asked = os.environ.get("BENCH_HALT_POLL_NS", "").strip()
    with haltpoll.window(asked) as halt_poll_ns:
        common = {"quick": a.quick, "reps": reps, "fs": fs_names, "work": str(a.work),
                  "packfs_opts": os.environ.get("BENCH_PACKFS_OPTS", ""),
                  "packfs_backing": os.environ.get("BENCH_PACKFS_BACKING", "xfs"),
                  "guest_halt_poll_ns": halt_poll_ns, "halt_poll_asked": bool(asked), "disk": model.to_dict()}
        try:
            return _run_parts(a, parts, reps, fs_names, notes, common, model)
        finally:
            diskmodel.remove_stale_throttles()


def _run_parts(a, parts: list[str], reps: int, fs_names: list[str], notes: list[str], common: dict,
               model: diskmodel.DiskModel) -> int:
    tmp = a.work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    log(f"parts {parts}, {'QUICK' if a.quick else 'full'} mode, {reps} reps, filesystems {fs_names}; "
        f"disk model {model.describe()}")

    done = []
    t_all = time.monotonic()
    for part in parts:
        res = Results(part, dict(common))
        for n in notes:
            res.note(n)
        t0 = time.monotonic()
        log(f"=== part {part} ===")
        try:
            if part == "fio":
                from . import fio as mod
                with _testbed(a, fs_names, size_gib=8 if a.quick else 16) as tb, _whole_part(model, tb, res):
                    mod.main(tb, res, a.quick, reps, tmp)
            elif part in ("swift", "swift-large"):
                from . import swiftbench as mod
                with _testbed(a, fs_names, size_gib=8 if a.quick else 16) as tb, _whole_part(model, tb, res):
                    mod.main(tb, res, a.quick, reps, a.work, only_large=part == "swift-large")
            elif part == "scale":
                from . import scale as mod
                n = a.objects or ((100_000 if model.throttled else 20_000) if a.quick else 1_000_000)
                size = 8 if n <= 100_000 else max(16, n * 24 // 1_000_000)
                with _testbed(a, fs_names, size_gib=size, ext4_inodes=max(1 << 20, n * 4)) as tb:
                    mod.main(tb, res, a.quick, reps, a.work, n, model)
        except KeyboardInterrupt:
            log("interrupted; filesystems were torn down")
            res.note(f"part {part} was interrupted")
            res.save(a.out)
            raise
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            res.note(f"part {part} failed: {e}")
        res.config["seconds"] = round(time.monotonic() - t0, 1)
        res.save(a.out)
        done.append(res.to_dict())
        log(f"=== part {part} done in {time.monotonic() - t0:.0f} s ===")

    name = "bench" if len(parts) == len(PARTS) else "bench-" + "-".join(parts)
    table = rep.report(a.out, done, name=name)
    print()
    print(table)
    print(f"\nresults: {a.out}/{name}.md, {name}.json, *.png  (total {time.monotonic() - t_all:.0f} s)")
    return 0


def _whole_part(model: diskmodel.DiskModel, tb: Testbed, res: Results):
    """The fio and swift parts on the hdd model: every device throttled for the whole part
    (its setup too: they have little); the scale part throttles case by case itself."""
    if model.throttled:
        res.note("fio and swift parts on the hdd model: the devices were throttled for the whole part, "
                 "setup included; disk requests per case are counted only in the scale part")
    return diskmodel.throttled(model, [t.loop for t in tb])


def _testbed(a, fs_names, size_gib: int, ext4_inodes=None) -> Testbed:
    return Testbed(a.work, size_gib, fs_names, packfs_opts=os.environ.get("BENCH_PACKFS_OPTS", ""),
                   backing=os.environ.get("BENCH_PACKFS_BACKING", "xfs"), ext4_inodes=ext4_inodes)


if __name__ == "__main__":
    sys.exit(main())
