"""Lots of small files (seed 004) on packfs, XFS and ext4.

1. Build a Swift device tree of N objects (1,000,000; 50,000 with QUICK) directly, in
   Swift's layout ``objects/<part>/<suffix>/<hash>/<ts>.data`` with the metadata xattrs
   written by Swift's own ``swift.obj.diskfile.write_metadata`` (so that the stock object
   server can GET them).  Two builder processes; no fsync per file, one sync at the end.
2. Unmount and mount again: clean mount time at N; packfs daemon RSS per stored file.
3. Interleaved repetitions, caches dropped before each: a replicator-style walk (listdir of
   every partition, suffix and hash dir; bench/walk.py) and random GETs through the stock
   object server at concurrency 16.
4. packfs only: PUT more objects, kill -9 the daemon, time the remount (recovery), then
   check that every acknowledged object reads back.
5. The same walk and GETs with the object server, the packfs daemon and the walker in one
   memory-limited cgroup (bench/cgroup.py).  The daemon is remounted and the object server
   restarted from inside the cgroup, so that all their memory is charged to it.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from . import cgroup
from . import swiftobj as so
from .part import Part
from .results import Results
from .util import REPO, drop_caches, log, rss_bytes


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


class ScaleBench(Part):
    def __init__(self, tb, res: Results, quick: bool, reps: int, work: Path, n: int):
        self.targets = list(tb)
        self.res = res
        self.quick = quick
        # QUICK: one cold repetition plus one in the cgroup (the walks dominate the run time)
        self.reps = 1 if quick else reps
        self.work = work
        self.n = n
        self.size = int(os.environ.get("BENCH_SCALE_SIZE", "4096"))
        self.gets = 800 if quick else 10000
        self.cg_reps = 1 if quick else max(1, reps - 1)
        self.cg_limit = int(os.environ.get("BENCH_CGROUP_MEM", "0")) or ((192 << 20) + n * 320)
        self.servers: dict[str, so.ObjectServer] = {}
        self.ts = f"{time.time() - 3600:016.5f}"
        self.rng = random.Random(5)

    def _add(self, key, t, value, **define):
        self.res.add(key, t.name, value, group=define.pop("group", "scale"), **define)

    # ------------------------------------------------------------------ steps
    def run(self) -> None:
        nk = f"{self.n / 1e6:g}M" if self.n >= 1_000_000 else f"{self.n // 1000}k"
        self.nk = nk
        rss0 = {}
        for t in self.targets:
            if t.is_packfs and t.daemon_pid():
                rss0[t.name] = rss_bytes(t.daemon_pid())
        for t in self.targets:
            self._guard("build", t, lambda: self.build(t))
        for t in self.targets:
            self._guard("remount", t, lambda: self.remount(t, rss0.get(t.name)))
        for t in self.targets:
            srv = so.ObjectServer(t.name, t.devices, self.work / "swift-scale" / t.name)
            self.servers[t.name] = srv
            srv.start()
        try:
            for rep in range(self.reps):
                for t in self._order(rep):
                    log(f"scale cold walk + GETs rep {rep + 1}/{self.reps} on {t.name}")
                    self._guard("cold walk/GETs", t, lambda: self.cold(t, None))
            for t in self.targets:
                if t.is_packfs and t.daemon_pid() and t.name in rss0:
                    rss = rss_bytes(t.daemon_pid())
                    self._add("scale.rss_per_file", t, (rss - rss0[t.name]) / self.n,
                              label=f"packfs daemon RSS per stored file at {nk} (after walks, minus empty mount)",
                              unit="B/file", better="lower", absolute=True)
                    self._add("scale.rss", t, rss / 2**20, label=f"packfs daemon RSS at {nk} files",
                              unit="MiB", better="lower", absolute=True)
            # recovery before the cgroup runs, so that an OOM kill there cannot spoil it
            for t in self.targets:
                if t.is_packfs:
                    self._guard("kill -9 recovery", t, lambda: self.recovery(t))
            kind = cgroup.available()
            if kind is None:
                self.res.note("cgroup runs skipped: no memory controller (cgroup v2 or v1) on this host")
            else:
                if kind == "v1":
                    self.res.note("cgroup v2 has no memory controller on this host; the memory limit "
                                  "uses the cgroup v1 memory controller (memory.limit_in_bytes)")
                for rep in range(self.cg_reps):
                    for t in self._order(rep):
                        log(f"scale cgroup ({self.cg_limit >> 20} MiB) walk + GETs rep {rep + 1}/{self.cg_reps} "
                            f"on {t.name}")
                        self._guard("cgroup walk/GETs", t, lambda: self.cold(t, self.cg_limit))
        finally:
            for srv in self.servers.values():
                srv.stop()

    def build(self, t) -> None:
        root = str(t.mnt)
        log(f"scale: building {self.n:,} objects of {self.size} B on {t.name}")
        ctx = mp.get_context("fork")
        done = ctx.Value("q", 0)
        nproc = 2
        t0 = time.monotonic()
        procs = [ctx.Process(target=_build_worker, args=(root, k, nproc, self.n, self.size, self.ts, done))
                 for k in range(nproc)]
        for p in procs:
            p.start()
        last = t0
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            if time.monotonic() - last >= 15:
                last = time.monotonic()
                v = done.value
                rate = v / (last - t0)
                eta = (self.n - v) / rate if rate else 0
                log(f"  {t.name} build: {v:,}/{self.n:,} ({rate:.0f} files/s, ~{eta:.0f} s left)")
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"builder failed (exit codes {[p.exitcode for p in procs]}), {done.value} built")
        t_sync = time.monotonic()
        os.sync()
        el = time.monotonic() - t0
        self._add("scale.build.files", t, self.n / el, label=f"tree build {self.nk} objects (no fsync; sync at end)",
                  unit="files/s")
        log(f"  {t.name} built {self.n:,} objects in {el:.1f} s ({self.n / el:.0f} files/s; sync "
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
            msg += f", daemon RSS {rss / 2**20:.0f} MiB; {_last_load(t.packdir)}"
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

    def _walk(self, t, cg) -> dict:
        kw = {}
        if cg is not None:
            kw["preexec_fn"] = cgroup.preexec_join(cg.procs_file())
        p = subprocess.run([sys.executable, "-m", "bench.walk", str(t.mnt)], capture_output=True, text=True,
                           cwd=REPO, timeout=7200, **kw)
        if p.returncode:
            raise RuntimeError(f"walk failed: {p.stderr.strip()[-400:]}")
        return json.loads(p.stdout)

    def cold(self, t, limit) -> None:
        srv = self.servers[t.name]
        names = [f"obj-{i}" for i in self.rng.sample(range(self.n), min(self.gets, self.n))]
        tag = "" if limit is None else ".cg"
        where = "" if limit is None else f", in a {limit >> 20} MiB cgroup"
        if limit is None:
            self._cold_run(t, srv, names, None, tag, where)
            return
        with cgroup.MemCgroup("packfs-bench", limit) as cg:
            # Memory already charged elsewhere does not move with a process (cgroup v2, and v1
            # on current kernels), so the packfs daemon is remounted and the object server
            # restarted from inside the cgroup: their whole footprint, the packfs table
            # loaded at mount included, counts against the limit.
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
            self._cold_run(t, srv, names, cg, tag, where)
            ooms = cg.oom_kills()
            if ooms:
                self.res.note(f"{t.name}: {ooms} OOM kill(s) in the {limit >> 20} MiB cgroup")
            peak = cg.usage()
            log(f"  {t.name} cgroup usage at end {peak / 2**20:.0f} MiB")
        if t.is_packfs:
            pid = t.daemon_pid()
            try:
                os.kill(pid, 0)
            except (TypeError, ProcessLookupError):
                raise RuntimeError(f"the packfs daemon ({pid}) died during the {limit >> 20} MiB cgroup run "
                                   "(OOM kill?)") from None
        for srv_pid in ([] if srv.proc is None else [srv.proc.pid]):
            if srv.proc.poll() is not None:
                raise RuntimeError(f"the object server ({srv_pid}) died during the cgroup run (OOM kill?)")

    def _cold_run(self, t, srv, names, cg, tag, where) -> None:
        drop_caches()
        w = self._walk(t, cg)
        self._add(f"scale.walk.cold{tag}.s", t, w["seconds"],
                  label=f"cold replicator walk, {self.nk} objects ({w['dirs']:,} dirs){where}",
                  unit="s", better="lower")
        if w["files"] < self.n:
            self.res.note(f"{t.name}: walk found {w['files']:,} files, expected {self.n:,}")
        drop_caches()
        ph = so.run_phase(srv.port, "GET", names, self.size, 16, 600)
        s = ph.summary()
        self._add(f"scale.get.cold{tag}.ops", t, ph.rate if ph.ops else None, detail=s,
                  label=f"cold random GETs c16 ({len(names):,} of {self.nk}){where}", unit="ops/s")
        self._add(f"scale.get.cold{tag}.p99", t, s.get("p99"), label=f"cold random GETs c16{where}: p99",
                  unit="ms", better="lower")
        if ph.errors:
            self.res.note(f"{t.name}: cold GETs{where}: {ph.errors} errors, first: {ph.first_error}")
        log(f"  {t.name}{where}: walk {w['seconds']:.2f} s ({w['dirs']:,} dirs, {w['files']:,} files), "
            f"GET {ph.rate:.0f} ops/s, p99 {s.get('p99', 0):.1f} ms")

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


def _last_load(packdir) -> str:
    """The daemon's last 'loaded N inodes from the image/catalog' log line, for the progress log."""
    lines = [ln for ln in (Path(packdir) / "packfs.log").read_text(errors="replace").splitlines()
             if "inodes from the" in ln]
    return lines[-1].split(": ", 1)[-1] if lines else "no load logged"


def main(tb, res: Results, quick: bool, reps: int, work: Path, n: int) -> None:
    sb = ScaleBench(tb, res, quick, reps, work, n)
    res.config["scale"] = {"objects": n, "object_size": sb.size, "random_gets": sb.gets, "reps": sb.reps,
                           "cgroup_limit": sb.cg_limit, "cgroup": cgroup.available(),
                           "cgroup_reps": sb.cg_reps, "part_power": so.PART_POWER}
    sb.run()
