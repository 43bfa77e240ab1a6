"""fio-jobs/ on packfs, XFS and ext4, interleaved: small files, streams, random reads, size sweep."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .part import Part
from .results import Results
from .testbed import Target
from .util import REPO, drop_caches, log, run, size_label

JOBS = REPO / "fio-jobs"
SWEEP_SIZES_K = (50, 100, 200, 300, 1000)


def _precreate(root: Path, jobs: int, nrfiles: int, prefix: str) -> None:
    for j in range(jobs):
        for n in range(nrfiles):
            os.makedirs(root / prefix / str(j) / str(n), exist_ok=True)


def run_fio(job: str, env: dict, outdir: Path) -> dict:
    out = outdir / f"fio-{job}-{os.getpid()}.json"
    e = dict(os.environ)
    e.update({k: str(v) for k, v in env.items()})
    p = run(["fio", "--output-format=json", f"--output={out}", "--disk_util=0", JOBS / f"{job}.fio"],
            check=False, env=e, timeout=3600)
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        data = None
    finally:
        out.unlink(missing_ok=True)
    if p.returncode or not data:
        raise RuntimeError(f"fio {job} rc={p.returncode}: {p.stderr.strip()[-800:]}")
    j = data["jobs"][0]
    if j.get("error"):
        raise RuntimeError(f"fio {job}: job error {j['error']}: {p.stderr.strip()[-800:]}")
    return j


def _pct(lat: dict, p: str) -> float | None:
    v = lat.get("percentile", {}).get(p)
    return v / 1e6 if v is not None else None  # ns -> ms


def _rmtree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)


class FioBench(Part):
    def __init__(self, targets: list[Target], res: Results, quick: bool, reps: int, tmp: Path):
        self.targets = targets
        self.res = res
        self.quick = quick
        self.reps = reps
        self.tmp = tmp
        q = quick
        self.small = {1: 1000 if q else 10000, 4: 300 if q else 3000}   # files per job
        self.stream_size = "256m" if q else "1g"
        self.rr_files = 2000 if q else 20000
        self.rr_fsize = "16k"
        self.rr_runtime = 2 if q else 10
        self.rr_cold_ios = 300 if q else 2500   # per job, 4 jobs: ~12% of the blocks
        self.sweep_bytes = (12 << 20) if q else (128 << 20)

    def run(self) -> None:
        steps = [s for s in os.environ.get("BENCH_FIO_STEPS", "small,stream,randread,sweep").split(",") if s]
        for i, step in enumerate(steps, 1):
            for rep in range(self.reps):
                for t in self._order(rep):
                    log(f"fio [{i}/{len(steps)}] {step} rep {rep + 1}/{self.reps} on {t.name}")
                    self._guard(step, t, lambda: getattr(self, "_" + step)(t, rep))

    # ------------------------------------------------------------ workloads
    def _small(self, t: Target, rep: int) -> None:
        for jobs, nr in self.small.items():
            d = t.mnt / "fio" / f"small{jobs}"
            _rmtree(d)
            _precreate(d, jobs, nr, "objects")
            os.sync()
            j = run_fio("smallfiles", {"BENCH_DIR": d, "NRFILES": nr, "NUMJOBS": jobs}, self.tmp)
            files_s = j["write"]["iops"]
            g = f"fio small files (8 KiB + fsync), {jobs} job{'s' if jobs > 1 else ''}"
            self.res.add(f"fio.small.j{jobs}.files", t.name, files_s, label=f"{g}: files/s",
                         unit="files/s", group="fio")
            self.res.add(f"fio.small.j{jobs}.fsync_p50", t.name, _pct(j["sync"]["lat_ns"], "50.000000"),
                         label=f"{g}: fsync p50", unit="ms", better="lower", group="fio")
            self.res.add(f"fio.small.j{jobs}.fsync_p99", t.name, _pct(j["sync"]["lat_ns"], "99.000000"),
                         label=f"{g}: fsync p99", unit="ms", better="lower", group="fio")
            self.res.add(f"fio.small.j{jobs}.write_p99", t.name, _pct(j["write"]["clat_ns"], "99.000000"),
                         label=f"{g}: write p99", unit="ms", better="lower", group="fio")
            log(f"  {t.name} small files {jobs} job(s): {files_s:.0f} files/s")
            _rmtree(d)

    def _stream(self, t: Target, rep: int) -> None:
        for bs in ("64k", "1m"):
            d = t.mnt / "fio" / "stream"
            d.mkdir(parents=True, exist_ok=True)
            j = run_fio("stream", {"BENCH_DIR": d, "BS": bs, "SIZE": self.stream_size}, self.tmp)
            mibs = j["write"]["bw_bytes"] / 2**20
            self.res.add(f"fio.stream.{bs}.mibs", t.name, mibs,
                         label=f"fio stream write {self.stream_size.upper()} in {bs.upper()} writes + fsync",
                         unit="MiB/s", group="fio")
            log(f"  {t.name} stream {bs}: {mibs:.0f} MiB/s")
            _rmtree(d)

    def _randread(self, t: Target, rep: int) -> None:
        d = t.mnt / "fio" / "randread"
        env = {"BENCH_DIR": d, "NRFILES": self.rr_files, "FSIZE": self.rr_fsize}
        if not (d / "rr").exists() or rep == 0:
            _rmtree(d)
            _precreate(d, 1, self.rr_files, "rr")
            run_fio("randread-layout", env, self.tmp)
        # warm: read every file once, then measure
        for n in range(self.rr_files):
            with open(d / "rr" / "0" / str(n) / "1700000000.00000.data", "rb") as f:
                while f.read(1 << 20):
                    pass
        env.update({"NUMJOBS": 4, "TOTAL": self.rr_files * (int(self.rr_fsize.rstrip("k")) << 10)})
        for mode in ("warm", "cold"):
            if mode == "cold":
                drop_caches()
                env.update({"TIME_BASED": 0, "RUNTIME": 600, "NUMBER_IOS": self.rr_cold_ios})
            else:
                env.update({"TIME_BASED": 1, "RUNTIME": self.rr_runtime, "NUMBER_IOS": 0})
            j = run_fio("randread", env, self.tmp)
            iops = j["read"]["iops"]
            lab = f"fio 4 KiB random reads over {self.rr_files} files of {self.rr_fsize.upper()}, 4 jobs, {mode}"
            self.res.add(f"fio.randread.{mode}.iops", t.name, iops, label=lab, unit="IOPS", group="fio")
            self.res.add(f"fio.randread.{mode}.p99", t.name, _pct(j["read"]["clat_ns"], "99.000000"),
                         label=f"{lab}: p99", unit="ms", better="lower", group="fio")
            log(f"  {t.name} randread {mode}: {iops:.0f} IOPS")
        if rep == self.reps - 1:
            _rmtree(d)

    def _sweep(self, t: Target, rep: int) -> None:
        for kib in SWEEP_SIZES_K:
            size = kib << 10
            nr = max(40, self.sweep_bytes // size)
            d = t.mnt / "fio" / "sweep"
            _rmtree(d)
            _precreate(d, 1, nr, f"sweep{kib}k")
            os.sync()
            t0 = time.monotonic()
            j = run_fio("sizesweep", {"BENCH_DIR": d, "NRFILES": nr, "FSIZE": f"{kib}k"}, self.tmp)
            mibs = j["write"]["bw_bytes"] / 2**20
            self.res.add(f"fio.sweep.{kib}k.mibs", t.name, mibs,
                         label=f"fio size sweep {size_label(size)}: write + fsync", unit="MiB/s", group="fio-sweep")
            self.res.add(f"fio.sweep.{kib}k.files", t.name, mibs * 2**20 / size,
                         label=f"fio size sweep {size_label(size)}: files/s", unit="files/s", group="fio-sweep",
                         minor=True)
            log(f"  {t.name} sweep {kib} KiB: {mibs:.1f} MiB/s ({time.monotonic() - t0:.1f} s)")
            _rmtree(d)


def main(testbed, res: Results, quick: bool, reps: int, tmp: Path) -> None:
    res.config.setdefault("fio", {})
    fb = FioBench(list(testbed), res, quick, reps, tmp)
    res.config["fio"] = {"small_files_per_job": fb.small, "stream_size": fb.stream_size,
                         "randread_files": fb.rr_files, "randread_fsize": fb.rr_fsize,
                         "randread_runtime_s": fb.rr_runtime, "randread_cold_ios_per_job": fb.rr_cold_ios, "sweep_bytes": fb.sweep_bytes}
    fb.run()
