"""The disk a benchmark case runs on: this machine's own (`fast`) or one 7200 rpm drive (`hdd`).

This VM's virtual disk serves a "cold" read from the host's cache in microseconds, so
there XFS's extra metadata IO is nearly free. packfs is built for hard disks, where each
random IO costs a seek. BENCH_DISK=hdd models one: while a case is measured, every loop
device under test (XFS's, ext4's, and the one holding packfs's pack) is throttled by the
kernel's block IO controller to BENCH_HDD_IOPS reads and as many writes per second and
BENCH_HDD_MBPS MB/s each way. Tree builds and remounts run unthrottled.

The throttle is imperfect (IO the kernel issues without accounting it to a cgroup can
escape it), so every case also counts the requests the device completed
(/sys/block/<loop>/stat) and gives a modelled hard-disk time beside the measured one:
each request one random access of BENCH_HDD_SEEK_MS, plus its bytes at BENCH_HDD_MBPS.
Counts do not depend on a noisy CPU: compare them first.

The modelled drive writes through (BENCH_HDD_WRITE_CACHE=off, the default): while a case
is measured the loop devices say they have no volatile write cache, so the kernel sends
them no cache flushes, and every request that carries data is one access. A drive with a
write-back cache spends its seek when a flush makes it write what it absorbed, not on the
write itself; the kernel's loop device (no FUA) turns each fdatasync into its data write
plus an empty flush request, and the throttle and the counts would charge both as
accesses (measured: a packfs commit 1 data write + 1 empty flush, an XFS log force 1
request carrying its own flushes), so `on` counts one fsync'd append twice. `on` keeps
the kernel's flushes, as runs before this knob measured.

The throttle is cgroup v1's root `blkio.throttle.*_device` (it holds every process's IO to
the device, writeback included). cgroup v2's `io.max` cannot be set on the root group, so
on a host with only cgroup v2 the hdd model refuses to run rather than measure an
unthrottled disk under its name.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .util import log

BLKIO = Path("/sys/fs/cgroup/blkio")
_KNOBS = ("read_iops_device", "write_iops_device", "read_bps_device", "write_bps_device")
LOOP_MAJOR = 7


@dataclass(frozen=True)
class DiskModel:
    kind: str          # "fast" or "hdd"
    iops: int          # per direction
    mbps: float        # MB/s per direction (10^6 bytes)
    seek_ms: float     # one random access
    write_cache: bool = False  # the loop devices keep their volatile write cache (flushes counted)

    @property
    def throttled(self) -> bool:
        return self.kind == "hdd"

    def describe(self) -> str:
        if not self.throttled:
            return "fast: this machine's virtual disk, unthrottled"
        return (f"hdd: one 7200 rpm drive modelled by the block IO throttle, {self.iops} read and {self.iops} "
                f"write IOPS, {self.mbps:g} MB/s each way, write cache {'on' if self.write_cache else 'off'}; "
                f"modelled time {self.seek_ms:g} ms a request plus its bytes at {self.mbps:g} MB/s")

    def modelled_seconds(self, io: "IoCount") -> float:
        """What the counted requests would take one after another on the modelled drive."""
        return (io.reads + io.writes) * self.seek_ms / 1e3 + (io.read_bytes + io.write_bytes) / (self.mbps * 1e6)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "iops": self.iops, "mbps": self.mbps, "seek_ms": self.seek_ms,
                "write_cache": self.write_cache}


def from_env() -> DiskModel:
    """BENCH_DISK (fast, hdd), BENCH_HDD_IOPS (150), BENCH_HDD_MBPS (160), BENCH_HDD_SEEK_MS (8.3),
    BENCH_HDD_WRITE_CACHE (off, on)."""
    kind = os.environ.get("BENCH_DISK", "fast").strip() or "fast"
    if kind not in ("fast", "hdd"):
        raise SystemExit(f"bench: BENCH_DISK={kind!r}: choose fast or hdd")
    cache = os.environ.get("BENCH_HDD_WRITE_CACHE", "off").strip() or "off"
    if cache not in ("off", "on"):
        raise SystemExit(f"bench: BENCH_HDD_WRITE_CACHE={cache!r}: choose off or on")
    try:
        model = DiskModel(kind, int(os.environ.get("BENCH_HDD_IOPS", "150")),
                          float(os.environ.get("BENCH_HDD_MBPS", "160")),
                          float(os.environ.get("BENCH_HDD_SEEK_MS", "8.3")), cache == "on")
    except ValueError as e:
        raise SystemExit(f"bench: a BENCH_HDD_* knob is not a number: {e}") from None
    if model.iops <= 0 or model.mbps <= 0 or model.seek_ms < 0:
        raise SystemExit("bench: BENCH_HDD_IOPS and BENCH_HDD_MBPS must be positive, BENCH_HDD_SEEK_MS not negative")
    return model


def check_available(model: DiskModel) -> None:
    """Refuse the hdd model, in one line, where the throttle cannot be set."""
    if model.throttled and not (BLKIO / "blkio.throttle.read_iops_device").exists():
        raise SystemExit("bench: BENCH_DISK=hdd needs cgroup v1's blkio throttle (/sys/fs/cgroup/blkio); "
                         "this host has none")


def dev_numbers(dev: str) -> str:
    """'MAJ:MIN' of a block device such as /dev/loop3."""
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def _set(devno: str, iops: int, bps: int) -> None:
    for knob in _KNOBS:
        value = iops if knob.endswith("iops_device") else bps
        (BLKIO / f"blkio.throttle.{knob}").write_text(f"{devno} {value}\n")


def _write_cache(dev: str) -> Path:
    return Path(f"/sys/block/{os.path.basename(dev)}/queue/write_cache")


@contextlib.contextmanager
def throttled(model: DiskModel, devs: list[str]) -> Iterator[None]:
    """The model's limits (and, without its write cache, a write-through queue) on these
    block devices for the length of the block; undone on the way out whatever happens.
    A no-op for the fast model."""
    if not model.throttled:
        yield
        return
    devnos = [dev_numbers(d) for d in devs]
    through = [] if model.write_cache else [d for d in devs if _write_cache(d).read_text().strip() == "write back"]
    try:
        for devno in devnos:
            _set(devno, model.iops, int(model.mbps * 1e6))
        for dev in through:
            _write_cache(dev).write_text("write through")
        yield
    finally:
        for devno in devnos:
            _set(devno, 0, 0)  # 0 removes a rule
        for dev in through:
            _write_cache(dev).write_text("write back")  # a loop device keeps it after it is detached


def release(dev: str) -> None:
    """Remove the throttle rules on one device and give it its write cache back: what an
    interrupted run left on a loop device it is about to detach."""
    if (BLKIO / "blkio.throttle.read_iops_device").exists():
        devno = dev_numbers(dev)
        for knob in _KNOBS:
            path = BLKIO / f"blkio.throttle.{knob}"
            if any(line.split()[0] == devno for line in path.read_text().splitlines()):
                log(f"cleanup: stale throttle {knob} on {devno}")
                path.write_text(f"{devno} 0\n")
    queue = _write_cache(dev)
    if queue.exists() and queue.read_text().strip() == "write through":
        log(f"cleanup: stale write-through queue on {dev}")
        queue.write_text("write back")


def remove_stale_throttles() -> None:
    """Remove every throttle rule on a loop device, and give every loop device its write
    cache back: what an interrupted run left behind (the benchmark is the only user of
    loop-device throttles on a machine that runs it). A loop device left writing through
    would not flush its backing file for whoever attaches it next."""
    for loop in Path("/sys/block").glob("loop*"):
        queue = loop / "queue" / "write_cache"  # a detached loop device always reads write through
        if (loop / "loop" / "backing_file").exists() and queue.read_text().strip() == "write through":
            log(f"cleanup: stale write-through queue on {loop.name}")
            queue.write_text("write back")
    if not BLKIO.exists():
        return
    for knob in _KNOBS:
        path = BLKIO / f"blkio.throttle.{knob}"
        for line in path.read_text().splitlines():
            devno = line.split()[0]
            if devno.split(":")[0] == str(LOOP_MAJOR):
                log(f"cleanup: stale throttle {knob} on {devno}")
                path.write_text(f"{devno} 0\n")


@dataclass(frozen=True)
class IoCount:
    reads: int = 0
    writes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    flushes: int = 0

    def __sub__(self, other: "IoCount") -> "IoCount":
        return IoCount(*(a - b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, ...]:
        return (self.reads, self.writes, self.read_bytes, self.write_bytes, self.flushes)


def io_count(dev: str) -> IoCount:
    """The requests `dev` has completed since it was made (/sys/block/<name>/stat)."""
    f = [int(x) for x in Path(f"/sys/block/{os.path.basename(dev)}/stat").read_text().split()]
    flushes = f[15] if len(f) > 15 else 0
    return IoCount(reads=f[0], writes=f[4], read_bytes=f[2] * 512, write_bytes=f[6] * 512, flushes=flushes)


class IoMeter:
    """Requests one device completes while a case runs: `with IoMeter(dev) as m: ...; m.io`."""

    def __init__(self, dev: str):
        self.dev = dev
        self.io = IoCount()
        self._start: IoCount | None = None

    def __enter__(self) -> "IoMeter":
        self._start = io_count(self.dev)
        return self

    def __exit__(self, *exc) -> None:
        assert self._start is not None
        self.io = io_count(self.dev) - self._start
