"""`python -m bench.importscale WORKDIR --source DIR`: seed 004's disk of millions of small
objects on packfs, its tree made by `packfs import` (issue 56's ten million objects).

Building millions of objects through a mount takes hours (a million took 16 minutes);
`packfs import` made seven million in 33 minutes here, as an operator moving an XFS
device onto packfs would. The
source is a Swift device tree of objects obj-0..N-1 (bench.scale's builder makes one:
`--build`), on any filesystem. Steps, each with a progress line on stderr:

1. import SOURCE into a fresh packfs PACKDIR (on an XFS loop image, as `make bench`'s):
   objects/s of the build;
2. mount it (this step and the rest on BENCH_DISK's model): clean mount seconds,
   daemon RSS per object and its parts (`packfs stats`);
3. the stock object server: cold GETs at c1 and c16 after dropping caches, ops/s and
   disk reads per GET on the pack's device;
4. a whole walk of the tree, as a replicator does: seconds, RSS per object after;
5. PUTs at c16, kill -9 the daemon, mount again: recovery seconds, and every
   acknowledged object and a sample of the tree read back.

Everything it made is torn down at the end (the source stays). Prints one summary line
per figure, and writes them to WORKDIR/importscale.json.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import diskmodel
from . import swiftobj as so
from .diskmodel import IoMeter
from .scale import build_objects, last_load
from .testbed import Testbed
from .util import REPO, drop_caches, log, rss_bytes
from .walk import walk

_GETS_C1, _GETS_C16, _PUTS = 300, 1600, 1000


class ImportScale:
    def __init__(self, tb: Testbed, source: Path, n: int, model: diskmodel.DiskModel, work: Path):
        self.t = tb.targets["packfs"]
        self.source = source
        self.n = n
        self.model = model
        self.work = work
        self.figures: dict[str, float] = {}
        self.rng = random.Random(56)

    def note(self, key: str, value: float, line: str) -> None:
        self.figures[key] = value
        log(f"importscale: {line}")

    def run(self) -> None:
        t = self.t
        rss_empty = rss_bytes(t.daemon_pid())
        t.umount()
        shutil.rmtree(t.packdir)
        self.imported()
        drop_caches()
        with diskmodel.throttled(self.model, [t.loop]):
            self.mounted(rss_empty)

    def mounted(self, rss_empty: int) -> None:
        """Every step after the import, on the disk model."""
        t = self.t
        seconds = t.mount()
        self.note("mount.clean.s", seconds, f"clean mount at {self.n:,} objects: {seconds:.2f} s "
                  f"({last_load(t.packdir)})")
        self.memory("mount", rss_empty)
        srv = so.ObjectServer("packfs", t.devices, self.work / "swift")
        srv.start()
        try:
            self.gets(srv, 1, _GETS_C1)
            self.gets(srv, 16, _GETS_C16)
            drop_caches()
            w = walk(str(t.mnt))
            self.note("walk.s", w["seconds"], f"walk of {w['files']:,} files in {w['dirs']:,} directories: "
                      f"{w['seconds']:.0f} s")
            self.memory("walk", rss_empty)
            self.recovery(srv)
        finally:
            srv.stop()

    def imported(self) -> None:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "packfs.cli", "import", str(self.source), str(self.t.packdir)],
                           cwd=REPO, stdout=subprocess.PIPE, text=True)  # progress passes on to stderr
        wall = time.monotonic() - t0
        if p.returncode:
            raise RuntimeError(f"packfs import failed ({p.returncode}): {p.stdout.strip()[-300:]}")
        built = float(re.search(r"checkpointed in ([\d,.]+) s", p.stdout).group(1).replace(",", ""))
        files = int(re.search(r": ([\d,]+) files", p.stdout).group(1).replace(",", ""))
        if files != self.n:
            raise RuntimeError(f"the import found {files:,} files in {self.source}, not {self.n:,} objects")
        self.note("import.objects_s", self.n / built, f"import: {self.n / built:,.0f} objects/s "
                  f"(built and checkpointed in {built:.0f} s; {wall:.0f} s with the check)")

    def memory(self, when: str, rss_empty: int) -> None:
        """Daemon RSS per object beyond an empty mount's, and the table's parts."""
        rss = rss_bytes(self.t.daemon_pid())
        st = self.t.stats()
        parts = {"columns": st["column_bytes"], "names": st["arena_bytes"]["names"],
                 "xattrs": st["arena_bytes"]["xattrs"]}
        self.figures.update({f"{when}.{k}_per_object": v / self.n for k, v in parts.items()})
        self.note(f"rss_per_object.{when}", (rss - rss_empty) / self.n,
                  f"after the {when}: daemon RSS {rss / 2**20:,.0f} MiB, {(rss - rss_empty) / self.n:.0f} B per "
                  f"object (" + ", ".join(f"{k} {v / self.n:.1f}" for k, v in parts.items()) + f"; {st['inodes']:,} "
                  f"inodes, {st['xattr_values_in_records']:,} xattr values in records)")

    def gets(self, srv: so.ObjectServer, conc: int, count: int) -> None:
        names = [f"obj-{i}" for i in self.rng.sample(range(self.n), count)]
        drop_caches()
        with IoMeter(self.t.loop) as meter:
            ph = so.run_phase(srv.port, "GET", names, 0, conc, 1800)
        if ph.errors:
            raise RuntimeError(f"cold GETs at c{conc}: {ph.errors} errors ({ph.first_error})")
        self.figures[f"get.c{conc}.reads_per_get"] = meter.io.reads / ph.ops
        self.note(f"get.c{conc}.ops_s", ph.rate, f"cold GETs at c{conc}: {ph.rate:,.0f} ops/s, "
                  f"{meter.io.reads / ph.ops:.2f} disk reads per GET ({self.model.kind} disk)")

    def recovery(self, srv: so.ObjectServer) -> None:
        extra = [f"crash-{i}" for i in range(_PUTS)]
        ph = so.run_phase(srv.port, "PUT", extra, 64, 16, 600)
        if ph.errors:
            raise RuntimeError(f"PUTs before kill -9: {ph.errors} errors ({ph.first_error})")
        self.t.kill9()
        seconds = self.t.mount()
        recovery = (self.t.stats() or {}).get("recovery")
        log("importscale: the daemon's log of that mount:\n" +
            "\n".join((self.t.packdir / "packfs.log").read_text(errors="replace").splitlines()[-12:]))
        self.note("mount.recovery.s", seconds, f"mount after kill -9 (recovery) at {self.n:,} objects: "
                  f"{seconds:.2f} s ({last_load(self.t.packdir)}; {recovery})")
        check = extra + [f"obj-{i}" for i in self.rng.sample(range(self.n), 1000)]
        back = so.run_phase(srv.port, "GET", check, 0, 4, 1800)
        if back.errors:
            raise RuntimeError(f"after kill -9, {back.errors} of {len(check)} acknowledged objects failed to "
                               f"GET ({back.first_error})")
        self.note("recovery.read_back", len(check), f"all {len(check):,} acknowledged objects read back")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.importscale", description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="where the pack's image, the mount and Swift's config go")
    ap.add_argument("--source", type=Path, required=True, help="a Swift device tree of objects obj-0..N-1")
    ap.add_argument("--objects", type=int, required=True, metavar="N", help="how many objects the source holds")
    ap.add_argument("--build", action="store_true", help="first make the N objects of --size B in SOURCE")
    ap.add_argument("--size", type=int, default=64, help="object size for --build (64: seed 004's)")
    ap.add_argument("--pack-gib", type=int, default=80, help="size of the pack's sparse XFS image")
    a = ap.parse_args(argv)
    if a.build:
        log(f"importscale: building {a.objects:,} objects of {a.size} B in {a.source}")
        build_objects(str(a.source), 0, a.objects, a.size, f"{time.time() - 3600:016.5f}", "source")
    if not (a.source / "objects").is_dir():
        raise SystemExit(f"importscale: {a.source}/objects is not a directory: give a Swift device tree, or --build")
    model = diskmodel.from_env()
    diskmodel.check_available(model)
    with Testbed(a.work, a.pack_gib, fs_names=("packfs",)) as tb:
        bench = ImportScale(tb, a.source, a.objects, model, a.work)
        bench.run()
    (a.work / "importscale.json").write_text(json.dumps(bench.figures, indent=1))
    print(json.dumps(bench.figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
