"""Stock Swift object server workloads on packfs, XFS and ext4, interleaved.

- PUT, GET, HEAD, DELETE of 4 KiB, 100 KiB, 1 MiB objects at concurrency 1 and 16:
  ops/s and latency mean/p50/p95/p99/max;
- one large object (1 GiB; 128 MiB with QUICK) by content-length and chunked in 64 KiB
  pieces, each first in every other repetition; the first read back;
- a size sweep 50 KiB .. 1 MiB (PUT and GET at concurrency 1), checked for dips;
- on packfs: FUSE requests per Swift PUT, GET and DELETE, by request type, from
  `packfs stats --json` diffs around N operations;
- where each operation's time goes (bench/timesplit.py): the object server's hub on and
  off a CPU, its pool threads, packfs's daemon, at concurrency 16 and for PUTs at 1;
- a container database as a container server drives it (bench/containerdb.py): merges
  of new rows, container updates, a listing.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from . import swiftobj as so
from . import timesplit
from .fusestats import request_table
from .part import Part
from .results import Results
from .util import REPO, log, run, size_label

SIZES = (4 << 10, 100 << 10, 1 << 20)
CONCS = (1, 16)
OPS = ("PUT", "GET", "HEAD", "DELETE")
SWEEP_K = (50, 100, 200, 300, 1000)


class SwiftBench(Part):
    def __init__(self, tb, res: Results, quick: bool, reps: int, work: Path):
        self.targets = list(tb)
        self.res = res
        self.quick = quick
        self.reps = reps
        self.work = work
        self.phase_s = 0.5 if quick else 6.0
        self.sweep_s = 0.4 if quick else 4.0
        self.big = (128 << 20) if quick else (1 << 30)
        self.max_ops = {4 << 10: 20000, 100 << 10: 5000, 1 << 20: 1500}
        self.servers: dict[str, so.ObjectServer] = {}
        self.run_id = 0
        self.splits: dict[tuple[str, str], list[dict]] = {}  # (operation, filesystem) -> timesplit.per_op

    def start(self) -> None:
        for t in self.targets:
            srv = so.ObjectServer(t.name, t.devices, self.work / "swift" / t.name)
            self.servers[t.name] = srv
            srv.start()
            log(f"swift: object server for {t.name} on 127.0.0.1:{srv.port} (pids {srv.pids()})")
            # warm-up: a few PUT/GET/DELETE so that the first timed phase is not a cold start
            names = [f"warm-{i}" for i in range(20)]
            for op in ("PUT", "GET", "DELETE"):
                ph = so.run_phase(srv.port, op, names, 4096, 4, 30)
                if ph.errors:
                    raise RuntimeError(f"{t.name}: warm-up {op} failed: {ph.first_error}\n{srv.log_tail()}")

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()

    # ------------------------------------------------------------------ parts
    def run(self, only_large: bool = False) -> None:
        self.start()
        try:
            if not only_large:
                self.fuse_requests()
                self.small()
            self.large()
            if not only_large:
                self.sweep()
                self.container_db()
        finally:
            self.stop()

    def _record(self, t, key, label, ph: so.Phase, group="swift", size: int = 0) -> None:
        """ops/s and latency rows; with size, a MiB/s row leads and the rest are detail rows."""
        s = ph.summary()
        if size:
            self.res.add(key + ".mibs", t.name, s["ops_s"] * size / 2**20 if ph.ops else None,
                         label=f"{label}: MiB/s", unit="MiB/s", group=group)
        self.res.add(key + ".ops", t.name, s["ops_s"] if ph.ops else None, detail=s,
                     label=f"{label}: ops/s", unit="ops/s", group=group, minor=bool(size))
        for stat, show in (("p50", not size), ("p99", not size), ("mean", False), ("p95", False), ("max", False)):
            self.res.add(f"{key}.{stat}", t.name, s.get(stat), label=f"{label}: {stat}", unit="ms",
                         better="lower", group=group, minor=not show)
        if ph.errors:
            self.res.note(f"{t.name}: {label}: {ph.errors} errors, first: {ph.first_error}")

    def small(self) -> None:
        n_cases = len(SIZES) * len(CONCS)
        i = 0
        for size in SIZES:
            for conc in CONCS:
                i += 1
                for rep in range(self.reps):
                    for t in self._order(rep):
                        log(f"swift [{i}/{n_cases}] {size_label(size)} c{conc} rep {rep + 1}/{self.reps} on {t.name}")
                        self._guard(f"{size_label(size)} c{conc}", t, lambda: self._small_case(t, size, conc, rep))
        if self.splits:
            self.res.tables["time_split"] = timesplit.table(self.splits)

    def _phase(self, t, label: str, op: str, names: list[str], size: int, conc: int, **kw) -> so.Phase:
        """run_phase, and where its time went (timesplit) at concurrency 16 and for PUTs."""
        srv = self.servers[t.name]
        if conc == 1 and op != "PUT":
            return so.run_phase(srv.port, op, names, size, conc, self.phase_s, **kw)
        workers, daemon = srv.worker_pids(), t.daemon_pid()
        before = timesplit.snapshot(workers, daemon)
        ph = so.run_phase(srv.port, op, names, size, conc, self.phase_s, **kw)
        got = timesplit.per_op(before, timesplit.snapshot(workers, daemon), ph.ops)
        if got is not None:
            self.splits.setdefault((label.format(op), t.name), []).append(got)
        return ph

    def _small_case(self, t, size: int, conc: int, rep: int) -> None:
        self.run_id += 1
        names = [f"o{size_label(size)}-c{conc}-r{rep}-{self.run_id}-{i}" for i in range(self.max_ops[size])]
        lab = f"Swift {{}} {size_label(size).replace('K', ' KiB').replace('M', ' MiB')} c{conc}"
        put = self._phase(t, lab, "PUT", names, size, conc)
        stored = names[:put.ops]  # GET/HEAD/DELETE what was PUT (a failed PUT shows as errors)
        self._record(t, f"swift.put.{size_label(size).lower()}.c{conc}", lab.format("PUT"), put)
        figs = [f"PUT {put.rate:.0f}"]
        if put.ops:
            for op in ("GET", "HEAD"):
                ph = self._phase(t, lab, op, stored[:put.ops], size, conc, max_ops=10**9, cycle=True)
                self._record(t, f"swift.{op.lower()}.{size_label(size).lower()}.c{conc}", lab.format(op), ph)
                figs.append(f"{op} {ph.rate:.0f}")
            ph = self._phase(t, lab, "DELETE", stored[:put.ops], size, conc)
            self._record(t, f"swift.delete.{size_label(size).lower()}.c{conc}", lab.format("DELETE"), ph)
            figs.append(f"DELETE {ph.rate:.0f}")
        log(f"  {t.name} {size_label(size)} c{conc} ops/s: " + ", ".join(figs))

    def large(self) -> None:
        lab = size_label(self.big).replace("M", " MiB").replace("G", " GiB")
        for rep in range(self.reps):
            for t in self._order(rep):
                log(f"swift large {lab} PUT/GET rep {rep + 1}/{self.reps} on {t.name}")
                self._guard("large object", t, lambda: self._large_case(t, rep, lab))

    def _large_case(self, t, rep: int, lab: str) -> None:
        port = self.servers[t.name].port
        mib = self.big / 2**20
        modes = (("cl", 0), ("chunked", 65536))
        # Alternated by repetition: whichever PUT comes first follows the other
        # filesystem's case (measured: packfs's content-length PUT, always first, ran 0.87x
        # its chunked one at 1 GiB; alone on one mount the two were even).
        for mode, chunk in modes if rep % 2 == 0 else modes[::-1]:
            name = f"big-{mode}-{rep}"
            sec = so.big_put(port, name, self.big, chunked=chunk)
            how = "content-length" if mode == "cl" else "chunked, 64 KiB pieces"
            self.res.add(f"swift.bigput.{mode}.mibs", t.name, mib / sec, label=f"Swift PUT {lab} ({how})",
                         unit="MiB/s", group="swift-big")
            log(f"  {t.name} PUT {lab} {mode}: {sec:.2f} s ({mib / sec:.0f} MiB/s)")
            if mode == "cl":
                sec_g, got = so.timed_get(port, name)
                if got != self.big:
                    raise RuntimeError(f"GET {name} returned {got} bytes, expected {self.big}")
                self.res.add("swift.bigget.mibs", t.name, mib / sec_g, label=f"Swift GET {lab}",
                             unit="MiB/s", group="swift-big")
                log(f"  {t.name} GET {lab}: {sec_g:.2f} s ({mib / sec_g:.0f} MiB/s)")
            so.single(port, "DELETE", name)

    def sweep(self) -> None:
        for i, kib in enumerate(SWEEP_K, 1):
            size = kib << 10
            for rep in range(self.reps):
                for t in self._order(rep):
                    log(f"swift sweep [{i}/{len(SWEEP_K)}] {kib} KiB rep {rep + 1}/{self.reps} on {t.name}")
                    self._guard(f"sweep {kib}k", t, lambda: self._sweep_case(t, size, kib, rep))

    def _sweep_case(self, t, size: int, kib: int, rep: int) -> None:
        port = self.servers[t.name].port
        self.run_id += 1
        names = [f"sw{kib}-r{rep}-{self.run_id}-{i}" for i in range(5000)]
        put = so.run_phase(port, "PUT", names, size, 1, self.sweep_s)
        self._record(t, f"swift.sweep.put.{kib}k", f"Swift PUT {kib} KiB c1 (sweep)", put, group="swift-sweep",
                     size=size)
        get = so.run_phase(port, "GET", names[:put.ops], size, 1, self.sweep_s, max_ops=10**9, cycle=True)
        self._record(t, f"swift.sweep.get.{kib}k", f"Swift GET {kib} KiB c1 (sweep)", get, group="swift-sweep",
                     size=size)
        so.run_phase(port, "DELETE", names[:put.ops], size, 4, 60)
        log(f"  {t.name} sweep {kib} KiB: PUT {put.rate * size / 2**20:.1f} MiB/s, "
            f"GET {get.rate * size / 2**20:.1f} MiB/s")

    # ------------------------------------------------------- container databases
    def container_db(self) -> None:
        for rep in range(self.reps):
            for t in self._order(rep):
                log(f"swift container database rep {rep + 1}/{self.reps} on {t.name}")
                self._guard("container database", t, lambda: self._container_db_case(t, rep))

    def _container_db_case(self, t, rep: int) -> None:
        rows, updates = (100_000, 5_000) if self.quick else (1_000_000, 20_000)
        where = t.mnt / f"containerdb-{rep}"
        try:
            p = run([sys.executable, "-m", "bench.containerdb", where, "--rows", rows, "--updates", updates,
                     "--merges", 100, "--batch", 100], cwd=REPO)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        got = json.loads(p.stdout)
        n = f"{rows // 1000}k" if rows < 10**6 else f"{rows // 10**6}M"
        lab = f"Swift container DB of {n} rows"
        group = "swift-db"
        self.res.add("swift.db.merge.p50", t.name, got["merge_p50_ms"], label=f"{lab}: merge of 100 rows, p50",
                     unit="ms", better="lower", group=group)
        self.res.add("swift.db.merge.p99", t.name, got["merge_p99_ms"], label=f"{lab}: merge of 100 rows, p99",
                     unit="ms", better="lower", group=group, minor=True)
        self.res.add("swift.db.updates", t.name, got["updates_s"], label=f"{lab}: container updates",
                     unit="ops/s", group=group)
        self.res.add("swift.db.update.p99", t.name, got["update_p99_ms"], label=f"{lab}: container update, p99",
                     unit="ms", better="lower", group=group, minor=True)
        self.res.add("swift.db.build", t.name, got["build_rows_s"], label=f"{lab}: build, 10,000 rows a merge",
                     unit="rows/s", group=group, minor=True)
        self.res.add("swift.db.list", t.name, got["list_rows_s"], label=f"{lab}: whole listing",
                     unit="rows/s", group=group)
        log(f"  {t.name} container DB: merge p50 {got['merge_p50_ms']:.1f} ms, {got['updates_s']:.0f} updates/s, "
            f"build {got['build_rows_s']:.0f} rows/s, listing {got['list_rows_s']:.0f} rows/s")

    # ------------------------------------------------------- FUSE requests
    def fuse_requests(self) -> None:
        t = next((x for x in self.targets if x.is_packfs), None)
        if t is None:
            return
        n = 50
        self._guard("FUSE request counts", t, lambda: self._fuse_requests(t, n))

    def _fuse_requests(self, t, n: int) -> None:
        port = self.servers[t.name].port
        names = [f"fusecount-{i}" for i in range(n)]
        per_op = {}
        for op in ("PUT", "GET", "DELETE"):
            before = t.stats()
            ph = so.run_phase(port, op, names, 4096, 1, 120)
            after = t.stats()
            if ph.errors:
                raise RuntimeError(f"{op}: {ph.first_error}")
            per_op[op] = (before, after, ph.ops)
        table = request_table(per_op)
        self.res.tables["fuse_requests"] = table
        tot = table.get("totals", {})
        log("  FUSE requests per 4 KiB op (c1): " + ", ".join(f"{k} {v:.1f}" for k, v in tot.items()))


def main(tb, res: Results, quick: bool, reps: int, work: Path, only_large: bool = False) -> None:
    """only_large: just the large-object PUTs and GET (seed 000's table; part swift-large),
    to compare mount options for large objects in a few minutes."""
    sb = SwiftBench(tb, res, quick, reps, work)
    res.config["swift"] = {"phase_seconds": sb.phase_s, "sweep_seconds": sb.sweep_s, "large_object": sb.big,
                           "max_ops": {size_label(k): v for k, v in sb.max_ops.items()},
                           "object_server": f"stock swift-object-server, workers={so.WORKERS}, "
                                            f"network_chunk_size={so.NETWORK_CHUNK}, one per filesystem",
                           "part_power": so.PART_POWER}
    sb.run(only_large)
