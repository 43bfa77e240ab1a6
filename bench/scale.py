"""Lots of small files (seed 004) on packfs, XFS and ext4, on the run's disk model.

1. Build a Swift device tree of N/2 objects directly, in Swift's layout
   ``objects/<part>/<suffix>/<hash>/<ts>.data`` with the metadata xattrs written by
   Swift's own ``swift.obj.diskfile.write_metadata`` (so that the stock object server can
   GET them). Two builder processes, no fsync per file, one sync at the end; unthrottled.
2. Single-threaded PUTs through the stock object server, cold (seed table 1 at N/2).
3. Build on to N; unmount and mount again: clean mount time, packfs daemon RSS per object.
4. Single-threaded PUTs again (seed table 1 at N).
5. Interleaved repetitions of the cold cases (coldcases.py): the walk (table 5),
   single-threaded and c16 GETs (tables 2, 4), c16 PUTs, and c16 GETs during a walk and the
   auditor (table 4).
6. PUTs at 20/s, hot and after dropping caches (table 3).
7. packfs only: PUT more objects, kill -9 the daemon, time the remount (recovery), then
   check that every acknowledged object reads back.
8. The cold cases again in each memory budget (table 6): the object server, the packfs
   daemon and the walkers in one memory-limited cgroup (bench/cgroup.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import subprocess
import time
from pathlib import Path

from . import cgroup
from . import swiftobj as so
from .coldcases import ColdCases, walk_json
from .diskmodel import DiskModel
from .part import Part
from .results import Results
from .util import drop_caches, log, rss_bytes


def _build_worker(root: str, start: int, step: int, n: int, size: int, ts: str, done) -> None:
    from swift.obj.diskfile import write_metadata
    import hashlib
    data = (b"packfs-bench-object-" * (size // 20 + 1))[:size]
    etag = hashlib.md5(data).hexdigest()
    made = set()
    count = 0
    objs = os.path.join(root, "objects")
    for i in range(start, n, step):
        name = f"obj-{i}"
        part, h = so.object_location(name)
        sdir = f"{objs}/{part}/{h[-3:]}"
        if sdir not in made:
            os.makedirs(sdir, exist_ok=True)
            made.add(sdir)
        hdir = f"{sdir}/{h}"
        try:
            os.mkdir(hdir)
        except FileExistsError:
            pass
        fd = os.open(f"{hdir}/{ts}.data", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            write_metadata(fd, {"name": f"/{so.ACCOUNT}/{so.CONTAINER}/{name}", "X-Timestamp": ts,
                                "Content-Type": "application/octet-stream", "ETag": etag,
                                "Content-Length": str(size)})
        finally:
            os.close(fd)
        count += 1
        if count % 500 == 0:
            with done.get_lock():
                done.value += 500
    with done.get_lock():
        done.value += count % 500


def build_objects(root: str, first: int, last: int, size: int, ts: str, name: str) -> None:
    """Swift objects first..last-1 under the device root, by two processes, with a line of
    progress every 15 s."""
    count = last - first
    ctx = mp.get_context("fork")
    done = ctx.Value("q", 0)
    nproc = 2
    t0 = time.monotonic()
    procs = [ctx.Process(target=_build_worker, args=(root, first + k, nproc, last, size, ts, done))
             for k in range(nproc)]
    for p in procs:
        p.start()
    shown = t0
    while any(p.is_alive() for p in procs):
        time.sleep(0.5)
        if time.monotonic() - shown >= 15:
            shown = time.monotonic()
            v = done.value
            rate = v / (shown - t0)
            eta = (count - v) / rate if rate else 0
            log(f"  {name} build: {v:,}/{count:,} ({rate:.0f} files/s, ~{eta:.0f} s left)")
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"builder failed (exit codes {[p.exitcode for p in procs]}), {done.value} built")


class ScaleBench(Part):
    def __init__(self, tb, res: Results, quick: bool, reps: int, work: Path, n: int, model: DiskModel):
        self.targets = list(tb)
        self.res = res
        self.quick = quick
        # QUICK: one cold repetition plus one in each memory budget (the walks dominate the run time)
        self.reps = 1 if quick else reps
        self.work = work
        self.n = n
        self.model = model
        # seed 004's objects were under 100 B; the fast tables have always used 4 KiB
        self.size = int(os.environ.get("BENCH_SCALE_SIZE", "64" if model.throttled else "4096"))
        self.gets = 800 if quick else 10000
        self.gets_c1 = 100 if quick else 1000
        self.puts_c1 = 300 if quick else 2000
        self.puts_c16 = 400 if quick else 2000
        self.budgets = memory_budgets(n)
        self.servers: dict[str, so.ObjectServer] = {}
        self.ts = f"{time.time() - 3600:016.5f}"
        self.rng = random.Random(5)
        self.nk = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"
        self.cases = ColdCases(res, model, quick, n, self.nk, self.size)

    def _add(self, key, t, value, **define):
        self.res.add(key, t.name, value, group=define.pop("group", "scale"), **define)

    # ------------------------------------------------------------------ steps
    def run(self) -> None:
        rss0 = {}
        for t in self.targets:
            if t.is_packfs and t.daemon_pid():
                rss0[t.name] = rss_bytes(t.daemon_pid())
        half = self.n // 2
        for t in self.targets:
            self._guard("build", t, lambda: self.build(t, 0, half))
        for t in self.targets:
            srv = so.ObjectServer(t.name, t.devices, self.work / "swift-scale" / t.name)
            self.servers[t.name] = srv
            srv.start()
        try:
            for t in self._order(0):
                self._guard("PUT c1 at N/2", t, lambda: self.cases.puts(
                    t, self.servers[t.name], 1, self.puts_c1, "scale.put.c1.half",
                    f"single-threaded PUTs of {self.size} B, cold, from {half:,} objects"))
            for t in self.targets:
                self._guard("build", t, lambda: self.build(t, half, self.n))
            for t in self.targets:
                self._guard("remount", t, lambda: self.remount(t, rss0.get(t.name)))
            for t in self._order(1):
                self._guard("PUT c1 at N", t, lambda: self.cases.puts(
                    t, self.servers[t.name], 1, self.puts_c1, "scale.put.c1.full",
                    f"single-threaded PUTs of {self.size} B, cold, from {self.n:,} objects"))
            for rep in range(self.reps):
                for t in self._order(rep):
                    log(f"scale cold cases rep {rep + 1}/{self.reps} on {t.name} ({self.model.kind} disk)")
                    self._guard("cold cases", t, lambda: self.cold_pass(t, None, "", ""))
            for t in self.targets:
                if t.is_packfs and t.daemon_pid() and t.name in rss0:
                    rss = rss_bytes(t.daemon_pid())
                    self._add("scale.rss_per_file", t, (rss - rss0[t.name]) / self.n,
                              label=f"packfs daemon RSS per stored file at {self.nk} (after walks, minus empty mount)",
                              unit="B/file", better="lower", absolute=True)
                    self._add("scale.rss", t, rss / 2**20, label=f"packfs daemon RSS at {self.nk} files",
                              unit="MiB", better="lower", absolute=True)
            for t in self._long_cases():
                self._guard("PUT 20/s", t, lambda: self.paced(t))
            # recovery before the cgroup runs, so that an OOM kill there cannot spoil it
            for t in self.targets:
                if t.is_packfs:
                    self._guard("kill -9 recovery", t, lambda: self.recovery(t))
            self.budget_passes()
        finally:
            for srv in self.servers.values():
                srv.stop()

    def _long_cases(self, rep: int = 0) -> list:
        """The filesystems of the paced PUTs and the memory budgets: all of them, but for a
        QUICK run on the hdd model, where ext4 alone would take longer than the rest (its
        cold walk of 100,000 objects runs at 14.5-17 directories/s there, its PUTs at ~5/s)."""
        order = self._order(rep)
        if self.quick and self.model.throttled and len(order) > 1:
            skipped = [t.name for t in order if t.name == "ext4"]
            if skipped:
                self.res.note("QUICK on the hdd model: ext4 runs the cold cases once, without the paced PUTs "
                              "and the memory budgets (a full run has them)")
            return [t for t in order if t.name != "ext4"]
        return order

    def cold_pass(self, t, cg, tag: str, where: str) -> None:
        """Seed 004's cold cases 2, 4 and 5 on one filesystem, in one memory budget."""
        srv = self.servers[t.name]
        self.cases.walk(t, cg, tag, where)
        self.cases.gets(t, srv, 1, self.gets_c1, tag, where)
        self.cases.gets(t, srv, 16, self.gets, tag, where)
        self.cases.puts(t, srv, 16, self.puts_c16, f"scale.put.c16.cold{tag}",
                        f"cold PUTs c16 of {self.size} B{where}")
        self.cases.gets_beside_walk(t, srv, cg, tag, where)

    def paced(self, t) -> None:
        """Seed table 3: PUTs at 20/s with a hot cache (after an unmeasured walk), then after
        dropping the caches."""
        walk_json(t, None, 300)  # warms the caches the PUTs' directories are in
        self.cases.paced_puts(t, self.servers[t.name], cold=False)
        self.cases.paced_puts(t, self.servers[t.name], cold=True)

    def budget_passes(self) -> None:
        kind = cgroup.available()
        if kind is None:
            self.res.note("memory-budget runs skipped: no memory controller (cgroup v2 or v1) on this host")
            return
        if kind == "v1":
            self.res.note("cgroup v2 has no memory controller on this host; the memory budgets use the "
                          "cgroup v1 memory controller (memory.limit_in_bytes)")
        for tag, what, limit in self.budgets:
            for rep in range(1 if self.quick else max(1, self.reps - 1)):
                for t in self._long_cases(rep):
                    log(f"scale {what} budget ({limit >> 20} MiB) rep {rep + 1} on {t.name}")
                    self._guard(f"{what} budget", t, lambda: self.in_budget(t, limit, tag, what))

    def build(self, t, first: int, last: int) -> None:
        """Objects first..last-1, unthrottled, as fast as two processes make them."""
        count = last - first
        log(f"scale: building objects {first:,} to {last:,} of {self.size} B on {t.name}")
        t0 = time.monotonic()
        build_objects(str(t.mnt), first, last, self.size, self.ts, t.name)
        t_sync = time.monotonic()
        os.sync()
        el = time.monotonic() - t0
        self._add("scale.build.files", t, count / el, label="tree build, unthrottled (no fsync; sync at end)",
                  unit="files/s")
        log(f"  {t.name} built {count:,} objects in {el:.1f} s ({count / el:.0f} files/s; sync "
            f"{time.monotonic() - t_sync:.1f} s)")

    def remount(self, t, rss_empty) -> None:
        if t.is_packfs and t.daemon_pid() and rss_empty:
            # What the build left in the running daemon, which the remount would drop.
            rss = rss_bytes(t.daemon_pid())
            self._add("scale.rss_per_file.built", t, (rss - rss_empty) / self.n,
                      label=f"packfs daemon RSS per stored file at {self.nk}, after the build (before remount)",
                      unit="B/file", better="lower", absolute=True, minor=True)
            self.memory_parts(t, built=True)
        t.umount()
        drop_caches()
        sec = t.mount()
        self._add("scale.mount.clean.s", t, sec, label=f"clean mount at {self.nk} objects", unit="s",
                  better="lower")
        msg = f"  {t.name} clean mount: {sec:.2f} s"
        if t.is_packfs and t.daemon_pid():
            rss = rss_bytes(t.daemon_pid())
            msg += f", daemon RSS {rss / 2**20:.0f} MiB; {last_load(t.packdir)}"
            if rss_empty:
                self._add("scale.rss_per_file.mount", t, (rss - rss_empty) / self.n,
                          label=f"packfs daemon RSS per stored file at {self.nk}, right after mount",
                          unit="B/file", better="lower", absolute=True, minor=True)
            self.memory_parts(t, built=False)
        log(msg)

    def memory_parts(self, t, built: bool) -> None:
        """Where the daemon's memory per stored object goes, from `packfs stats`: the inode
        columns, the names and xattr arenas (each with its free space), and inodes per object.
        After the build it also counts the unlinked inodes still held (a leak would show there:
        a remount drops them)."""
        st = t.stats()
        when, tag = ("after the build", ".built") if built else ("right after mount", "")
        parts = {"inode columns": st["column_bytes"], "names arena": st["arena_bytes"]["names"],
                 "names arena, of it free": st["arena_free_bytes"]["names"],
                 "xattr arena": st["arena_bytes"]["xattrs"],
                 "xattr arena, of it free": st["arena_free_bytes"]["xattrs"]}
        for what, size in parts.items():
            self._add(f"scale.memory.{what.replace(',', '').replace(' ', '_')}{tag}", t, size / self.n,
                      label=f"packfs memory per stored file at {self.nk}, {when}: {what}",
                      unit="B/file", better="lower", absolute=True, minor=True)
        self._add(f"scale.memory.inodes{tag}", t, st["inodes"] / self.n,
                  label=f"packfs inodes per stored file at {self.nk}, {when}", unit="inodes", better="lower",
                  absolute=True, minor=True)
        if built:
            held = st["unlinked_in_use"]
            self._add("scale.memory.unlinked_in_use.built", t, held["open"] + held["kernel_only"],
                      label=f"packfs unlinked inodes still held at {self.nk}, {when}", unit="inodes",
                      better="lower", absolute=True, minor=True)
        for which, far in st["far_times"].items():
            if far is not None:
                self._add(f"scale.memory.far_{which}s{tag}", t, far / self.n,
                          label=f"packfs {which}s kept whole beside their column per stored file at {self.nk}, {when}",
                          unit="times", better="lower", absolute=True, minor=True)

    def in_budget(self, t, limit: int, tag: str, what: str) -> None:
        """The cold cases with the object server, the packfs daemon and the walkers in one
        memory-limited cgroup. Memory already charged elsewhere does not move with a
        process (cgroup v2, and v1 on current kernels), so the packfs daemon is remounted
        and the object server restarted from inside the cgroup: their whole footprint, the
        packfs table loaded at mount included, counts against the limit, as the XFS and
        ext4 inode and dentry caches the walkers fill do."""
        srv = self.servers[t.name]
        where = f", in {what} ({limit >> 20} MiB)"
        with cgroup.MemCgroup("packfs-bench", limit) as cg:
            with cg.joined():
                if t.is_packfs:
                    t.umount()
                    drop_caches()
                    try:
                        t.mount()
                    except subprocess.CalledProcessError as e:
                        oom = " (its daemon was OOM-killed loading the table)" if cg.oom_kills() else ""
                        raise RuntimeError(f"packfs could not mount in the {limit >> 20} MiB cgroup{oom}: "
                                           f"{(e.stderr or '').strip()[:200]}") from None
                srv.stop()
                srv.start()
            for pid in srv.pids() + t.pids():
                cg.add(pid)  # no-op when already inside
            log(f"  {t.name} cgroup usage after (re)start {cg.usage() / 2**20:.0f} MiB")
            try:
                self.cold_pass(t, cg, tag, where)
            finally:
                ooms = cg.oom_kills()
                if ooms:
                    self.res.note(f"{t.name}: {ooms} OOM kill(s) in {what} ({limit >> 20} MiB)")
                log(f"  {t.name} cgroup usage at end {cg.usage() / 2**20:.0f} MiB")
        if t.is_packfs:
            pid = t.daemon_pid()
            try:
                os.kill(pid, 0)
            except (TypeError, ProcessLookupError):
                raise RuntimeError(f"the packfs daemon ({pid}) died in {what} ({limit >> 20} MiB; OOM kill?)") from None
        if srv.proc is not None and srv.proc.poll() is not None:
            raise RuntimeError(f"the object server ({srv.proc.pid}) died in {what} (OOM kill?)")

    def recovery(self, t) -> None:
        srv = self.servers[t.name]
        extra = [f"crash-{i}" for i in range(200 if self.quick else 1000)]
        ph = so.run_phase(srv.port, "PUT", extra, self.size, 16, 600)
        acked = extra[:ph.ops] if not ph.errors else None
        if ph.errors:
            self.res.note(f"{t.name}: PUTs before kill -9: {ph.errors} errors ({ph.first_error})")
        t.kill9()
        t0 = time.monotonic()
        t.mount()
        sec = time.monotonic() - t0
        self._add("scale.mount.recovery.s", t, sec,
                  label=f"mount after kill -9 at {self.nk} objects (recovery)", unit="s", better="lower")
        st = t.stats() or {}
        log(f"  {t.name} recovery mount after kill -9: {sec:.2f} s ({st.get('recovery')})")
        # every acknowledged PUT must read back, and a sample of the tree
        check = (acked or []) + [f"obj-{i}" for i in self.rng.sample(range(self.n), min(200, self.n))]
        bad = so.run_phase(srv.port, "GET", check, self.size, 4, 600)
        if bad.errors:
            self.res.note(f"{t.name}: after kill -9 and remount, {bad.errors} of {len(check)} acknowledged "
                          f"objects failed to GET (first: {bad.first_error})")
        else:
            log(f"  {t.name}: all {len(check)} acknowledged objects read back after kill -9")


def last_load(packdir) -> str:
    """The daemon's last 'loaded N inodes from the image/catalog' log line, for the progress log."""
    lines = [ln for ln in (Path(packdir) / "packfs.log").read_text(errors="replace").splitlines()
             if "inodes from the" in ln]
    return lines[-1].split(": ", 1)[-1] if lines else "no load logged"


def memory_budgets(n: int) -> list[tuple[str, str, int]]:
    """(key tag, name, bytes) of each memory budget: seed 004's node with 4 GB left for one
    disk of 8 M objects (500 B an object) and for three such disks (170 B), each on top of
    BENCH_CGROUP_BASE (128 MiB: the processes' own memory, which does not grow with the
    objects); BENCH_CGROUP_MEM gives one budget of its own instead."""
    fixed = int(os.environ.get("BENCH_CGROUP_MEM", "0"))
    if fixed:
        return [(".cg", "the given budget", fixed)]
    base = int(os.environ.get("BENCH_CGROUP_BASE", str(128 << 20)))
    return [(".cg500", "500 B/object", base + 500 * n), (".cg170", "170 B/object", base + 170 * n)]


def main(tb, res: Results, quick: bool, reps: int, work: Path, n: int, model: DiskModel) -> None:
    sb = ScaleBench(tb, res, quick, reps, work, n, model)
    res.config["scale"] = {"objects": n, "object_size": sb.size, "random_gets": sb.gets, "reps": sb.reps,
                           "memory_budgets": {name: limit for _, name, limit in sb.budgets},
                           "cgroup": cgroup.available(), "part_power": so.PART_POWER, "disk": model.to_dict()}
    sb.run()
