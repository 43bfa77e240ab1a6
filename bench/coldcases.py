"""The scale part's cases (seed 004's tables), each measured on the run's disk model.

Every case starts cold: XFS and ext4 are unmounted and mounted again (one drop_caches
leaves XFS's metadata buffers behind) and the page cache is dropped; packfs keeps its
inode table, which is the product, and only its page cache and its backing
filesystem's are dropped. While a case runs, the device under test is throttled to the
disk model (diskmodel.py) and its completed requests are counted, up to the end of a
sync after the case: the writes a case leaves dirty are its cost too. Each case records
its figure, disk reads and writes per operation, the requests per second the device
actually served, and the modelled hard-disk time beside the measured one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any, Callable

from . import cgroup, diskmodel, paced
from . import swiftobj as so
from .diskmodel import DiskModel, IoCount, IoMeter
from .results import Results
from .util import REPO, drop_caches, log


class ColdCases:
    """Cases on one filesystem at a time; `tag` and `where` name the memory budget they ran in."""

    def __init__(self, res: Results, model: DiskModel, quick: bool, n: int, nk: str, size: int):
        self.res = res
        self.model = model
        self.quick = quick
        self.n = n
        self.nk = nk
        self.size = size
        self.seq = 0  # names of new objects never repeat within a run
        self.own: dict[str, int] = {}  # packfs's own counts of the last measured case

    # ------------------------------------------------------------------ plumbing
    def make_cold(self, t: Any) -> None:
        if t.is_packfs:
            drop_caches()
        else:
            t.umount()
            drop_caches()
            t.mount()

    def measured(self, t: Any, fn: Callable[[], Any]) -> tuple[Any, IoCount, float]:
        """fn() on the throttled device; (its result, the requests counted, its seconds).
        On packfs it also keeps what the daemon counted of its own writes (`self.own`)."""
        before = _own_writes(t)
        with diskmodel.throttled(self.model, [t.loop]), IoMeter(t.loop) as meter:
            t0 = time.monotonic()
            out = fn()
            seconds = time.monotonic() - t0
            os.sync()
            _settle(t.loop)
        after = _own_writes(t)
        self.own = {k: after[k] - before[k] for k in after} if before and after else {}
        return out, meter.io, seconds

    def _io_rows(self, key: str, t: Any, io: IoCount, seconds: float, ops: int, per: str, label: str) -> None:
        """Disk requests per operation, the rates the device served, modelled and measured time."""
        if ops:
            self.res.add(f"{key}.reads_per_{per}", t.name, io.reads / ops, label=f"{label}: disk reads per {per}",
                         unit="reads", better="lower", group="scale-io")
            self.res.add(f"{key}.writes_per_{per}", t.name, io.writes / ops,
                         label=f"{label}: disk writes per {per}", unit="writes", better="lower", group="scale-io")
        if seconds > 0:
            self.res.add(f"{key}.read_rate", t.name, io.reads / seconds, label=f"{label}: disk reads/s served",
                         unit="reads/s", better="lower", absolute=True, minor=True, group="scale-io")
            self.res.add(f"{key}.write_rate", t.name, io.writes / seconds, label=f"{label}: disk writes/s served",
                         unit="writes/s", better="lower", absolute=True, minor=True, group="scale-io")
        self.res.add(f"{key}.modelled_s", t.name, self.model.modelled_seconds(io),
                     label=f"{label}: modelled hard-disk time ({self.model.seek_ms:g} ms a request)", unit="s",
                     better="lower", minor=True, group="scale-io")
        self.res.add(f"{key}.measured_s", t.name, seconds, label=f"{label}: measured time", unit="s",
                     better="lower", minor=True, group="scale-io")
        self.res.add(f"{key}.io", t.name, None, detail={**dataclasses.asdict(io), "seconds": seconds, "ops": ops,
                                                        **{f"packfs_{k}": v for k, v in self.own.items()}})
        if self.own and ops:
            # Which of the device's writes were the log's (data and META records, in
            # pwritevs), and how many commits and checkpoints (the catalog's) there were.
            for what, n in self.own.items():
                self.res.add(f"{key}.packfs_{what}_per_{per}", t.name, n / ops,
                             label=f"{label}: packfs {what.replace('_', ' ')} per {per}", unit=what.split("_")[-1],
                             better="lower", absolute=True, minor=True, group="scale-io")

    def _names(self, prefix: str, count: int) -> list[str]:
        self.seq += 1
        return [f"{prefix}{self.seq}-{i}" for i in range(count)]

    # ------------------------------------------------------------------ cases
    def walk(self, t: Any, cg: Any, tag: str, where: str) -> None:
        """Seed table 5: a replicator-style walk (listdir of every partition, suffix and hash
        dir). On the hdd model it stops at a time limit: directories a second and disk reads
        a directory are then its figures, and its time is left out."""
        limit = (60 if self.quick else 900) if self.model.throttled else 0
        self.make_cold(t)
        w, io, seconds = self.measured(t, lambda: walk_json(t, cg, limit))
        key = f"scale.walk.cold{tag}"
        label = f"cold replicator walk, {self.nk} objects{where}"
        if w["complete"]:
            self.res.add(f"{key}.s", t.name, w["seconds"], label=f"{label} ({w['dirs']:,} dirs)", unit="s",
                         better="lower")
            if w["files"] < self.n:
                self.res.note(f"{t.name}: walk found {w['files']:,} files, expected {self.n:,}")
        else:
            self.res.note(f"{t.name}: {label}: stopped at its {limit} s limit after {w['dirs']:,} directories")
        self.res.add(f"{key}.dirs_per_s", t.name, w["dirs"] / w["seconds"], label=f"{label}: directories/s",
                     unit="dirs/s")
        self._io_rows(key, t, io, seconds, w["dirs"], "dir", f"cold walk{where}")
        log(f"  {t.name}{where}: walk {w['seconds']:.1f} s{'' if w['complete'] else ' (limit)'}, {w['dirs']:,} dirs, "
            f"{io.reads:,} disk reads ({io.reads / max(1, w['dirs']):.2f} a dir)")

    def gets(self, t: Any, srv: Any, conc: int, count: int, tag: str, where: str) -> None:
        """Seed tables 2 and 4: cold random GETs of objects of the tree, at c1 or c16."""
        names = [f"obj-{i}" for i in _sample(self.n, count, self.seq)]
        self.seq += 1
        self.make_cold(t)
        ph, io, seconds = self.measured(t, lambda: so.run_phase(srv.port, "GET", names, self.size, conc,
                                                                 120 if self.quick else 600))
        self._phase_rows(f"scale.get.c{conc}.cold{tag}", t, ph, io, seconds,
                         f"cold random GETs c{conc} ({len(names):,} of {self.nk}){where}", "GET")

    def puts(self, t: Any, srv: Any, conc: int, count: int, key: str, label: str) -> None:
        """Seed tables 1 and 4: PUTs of new small objects into the cold tree."""
        names = self._names("put", count)
        self.make_cold(t)
        ph, io, seconds = self.measured(t, lambda: so.run_phase(srv.port, "PUT", names, self.size, conc, 900))
        self._phase_rows(key, t, ph, io, seconds, label, "PUT")

    def _phase_rows(self, key: str, t: Any, ph: so.Phase, io: IoCount, seconds: float, label: str,
                    op: str) -> None:
        s = ph.summary()
        self.res.add(f"{key}.ops", t.name, ph.rate if ph.ops else None, detail=s, label=label, unit="ops/s")
        self.res.add(f"{key}.p99", t.name, s.get("p99"), label=f"{label}: p99", unit="ms", better="lower")
        modelled = self.model.modelled_seconds(io)
        if self.model.throttled and ph.ops and modelled > 0:
            # The throttle holds bios, the drive serves requests: where the kernel merges many
            # bios into one request (ext4's journal) the throttle is harsher than the drive.
            self.res.add(f"{key}.modelled_ops", t.name, ph.ops / modelled,
                         label=f"{label}: on the modelled drive (counted requests, one after another)",
                         unit="ops/s")
        self._io_rows(key, t, io, seconds, ph.ops, op, label)
        if ph.errors:
            self.res.note(f"{t.name}: {label}: {ph.errors} errors, first: {ph.first_error}")
        log(f"  {t.name}: {label}: {ph.rate:.1f} ops/s, p99 {s.get('p99', 0):.0f} ms, "
            f"{io.reads / max(1, ph.ops):.2f} reads and {io.writes / max(1, ph.ops):.2f} writes a {op}")

    def gets_beside_walk(self, t: Any, srv: Any, cg: Any, tag: str, where: str) -> None:
        """Seed table 4: cold GETs c16 while a replicator-style walk and one pass of
        swift-object-auditor run on the device. The GETs run until the walk ends or the
        window closes; whatever still runs then is stopped by its PID."""
        window = 30 if self.quick else 300
        names = [f"obj-{i}" for i in _sample(self.n, 100_000, self.seq)]
        self.seq += 1
        self.make_cold(t)

        def case() -> tuple[so.Phase, bool]:
            with ExitStack() as stack:
                walker = stack.enter_context(_background([sys.executable, "-m", "bench.walk", str(t.mnt)], cg))
                stack.enter_context(_background([so.swift_bin("swift-object-auditor"),
                                                 str(srv.swift_dir / "object-server.conf"), "once"], cg))
                ph = _phase_until(srv.port, names, self.size, 16, window, walker)
                return ph, walker.poll() is not None

        (ph, walk_done), io, seconds = self.measured(t, case)
        label = f"cold GETs c16 during a walk and the auditor{where}"
        self._phase_rows(f"scale.get.beside_walk{tag}", t, ph, io, seconds, label, "GET")
        if not walk_done:
            self.res.note(f"{t.name}: {label}: the walk had not ended when the {window} s window closed")

    def paced_puts(self, t: Any, srv: Any, cold: bool) -> None:
        """Seed table 3: PUTs at 20 a second, open loop, with a hot cache or after dropping it."""
        seconds = int(os.environ.get("BENCH_PACED_SECONDS", "0")) or (120 if self.quick else 600)
        if cold:
            self.make_cold(t)
        self.seq += 1
        out, io, took = self.measured(t, lambda: paced.put_paced(srv.port, f"paced{self.seq}", self.size, 20,
                                                                  seconds))
        s = out.summary()
        state = "after dropping caches" if cold else "hot cache"
        key = f"scale.put.paced.{'cold' if cold else 'hot'}"
        span = f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"
        label = f"PUT 20/s for {span}, {state}"
        for stat in ("mean", "p50", "p95", "p99", "max"):
            self.res.add(f"{key}.{stat}", t.name, s.get(stat), detail=s if stat == "p99" else None,
                         label=f"{label}: latency {stat}", unit="ms", better="lower", minor=stat != "p99")
        self.res.add(f"{key}.under30", t.name, s["under_timeout_pct"], label=f"{label}: answered within 30 s",
                     unit="%", absolute=True)
        self._io_rows(key, t, io, took, s["sent"], "PUT", label)
        if s["errors"] or s["timeouts"]:
            self.res.note(f"{t.name}: {label}: {s['timeouts']} timeouts, {s['errors']} errors "
                          f"{s['first_error']}".rstrip())
        log(f"  {t.name}: {label}: p50 {s.get('p50', 0):.0f} ms, p99 {s.get('p99', 0):.0f} ms, "
            f"{s['under_timeout_pct']:.1f}% within 30 s, {io.writes / max(1, s['sent']):.2f} writes a PUT")


def _settle(dev: str, quiet: float = 1.0, limit: float = 300.0) -> None:
    """Wait until the device has completed no request for `quiet` seconds: requests a
    client gave up on (a paced PUT past its timeout) are still served, and they are the
    case's cost, not the next case's."""
    last, since, end = diskmodel.io_count(dev), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end:
        time.sleep(0.2)
        now = diskmodel.io_count(dev)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
    log(f"  {dev} was still busy {limit:.0f} s after the case")


def _own_writes(t: Any) -> dict[str, int]:
    """packfs's counts of its own device writes, flushes, commits and checkpoints."""
    if not t.is_packfs:
        return {}
    st = t.stats() or {}
    return {"log_writes": st.get("device_writes", 0), "log_flushes": st.get("device_flushes", 0),
            "commits": st.get("commits", 0), "checkpoints": st.get("checkpoints", 0)}


def _sample(n: int, count: int, seed: int) -> list[int]:
    import random
    return random.Random(seed).sample(range(n), min(count, n))


def walk_json(t: Any, cg: Any, limit: float = 0.0) -> dict:
    """bench.walk in a process of its own (in the cgroup `cg`, if any): its figures."""
    kw = {} if cg is None else {"preexec_fn": cgroup.preexec_join(cg.procs_file())}
    p = subprocess.run([sys.executable, "-m", "bench.walk", str(t.mnt), str(limit)], capture_output=True, text=True,
                       cwd=REPO, timeout=7200, **kw)
    if p.returncode:
        raise RuntimeError(f"walk failed: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


class _background:
    """A process for the length of a with block, stopped by its PID (and its group) at the end."""

    def __init__(self, argv: list[str], cg: Any):
        self.argv = argv
        self.cg = cg
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> subprocess.Popen:
        kw = {} if self.cg is None else {"preexec_fn": cgroup.preexec_join(self.cg.procs_file())}
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True, **kw)
        return self.proc

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
            except ProcessLookupError:
                pass


def _phase_until(port: int, names: list[str], size: int, conc: int, window: float,
                 walker: subprocess.Popen) -> so.Phase:
    """GETs in slices of a few seconds until the walker ends or the window closes."""
    total = so.Phase()
    end = time.monotonic() + window
    pos = 0
    while time.monotonic() < end and walker.poll() is None and pos < len(names):
        ph = so.run_phase(port, "GET", names[pos:], size, conc, min(5.0, end - time.monotonic()))
        pos += ph.ops + ph.errors
        total.ops += ph.ops
        total.seconds += ph.seconds
        total.lat += ph.lat
        total.errors += ph.errors
        total.bytes += ph.bytes
        total.first_error = total.first_error or ph.first_error
    return total
