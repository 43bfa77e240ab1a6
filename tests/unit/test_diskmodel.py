"""The benchmark's disk model (bench/diskmodel.py): its knobs, its arithmetic, and a throttle
rule that is set on a real loop device for the length of a block and removed whatever happens."""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import diskmodel  # noqa: E402
from bench.diskmodel import DiskModel, IoCount  # noqa: E402

HDD = DiskModel("hdd", 150, 160.0, 8.3)


def test_the_modelled_time_is_a_seek_a_request_plus_the_bytes_at_the_drives_rate():
    io = IoCount(reads=100, writes=50, read_bytes=80_000_000, write_bytes=80_000_000)
    assert HDD.modelled_seconds(io) == pytest.approx(150 * 0.0083 + 1.0)
    assert HDD.modelled_seconds(IoCount()) == 0


def test_counts_subtract_field_by_field():
    assert IoCount(5, 7, 4096, 8192, 2) - IoCount(1, 2, 0, 4096, 1) == IoCount(4, 5, 4096, 4096, 1)


@pytest.mark.parametrize("env, message", [
    ({"BENCH_DISK": "ssd"}, "choose fast or hdd"),
    ({"BENCH_DISK": "hdd", "BENCH_HDD_IOPS": "many"}, "not a number"),
    ({"BENCH_DISK": "hdd", "BENCH_HDD_MBPS": "0"}, "must be positive"),
    ({"BENCH_DISK": "hdd", "BENCH_HDD_WRITE_CACHE": "maybe"}, "choose off or on"),
])
def test_bad_knobs_are_refused_in_one_line(monkeypatch, env, message):
    for name in ("BENCH_DISK", "BENCH_HDD_IOPS", "BENCH_HDD_MBPS", "BENCH_HDD_SEEK_MS", "BENCH_HDD_WRITE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=message) as refused:
        diskmodel.from_env()
    assert "\n" not in str(refused.value)


def test_the_defaults_are_one_7200_rpm_drive(monkeypatch):
    monkeypatch.setenv("BENCH_DISK", "hdd")
    for name in ("BENCH_HDD_IOPS", "BENCH_HDD_MBPS", "BENCH_HDD_SEEK_MS", "BENCH_HDD_WRITE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert diskmodel.from_env() == HDD  # writing through
    monkeypatch.setenv("BENCH_HDD_WRITE_CACHE", "on")
    assert diskmodel.from_env().write_cache


@pytest.fixture
def loop_device(tmp_path):
    if os.geteuid() != 0 or not (diskmodel.BLKIO / "blkio.throttle.write_iops_device").exists():
        pytest.skip("needs root and cgroup v1's blkio throttle")
    img = tmp_path / "disk.img"
    img.write_bytes(b"")
    os.truncate(img, 16 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def _rules(devno: str) -> list[str]:
    return [line for knob in ("read_iops_device", "write_iops_device", "read_bps_device", "write_bps_device")
            for line in (diskmodel.BLKIO / f"blkio.throttle.{knob}").read_text().splitlines()
            if line.split()[0] == devno]


def test_the_throttle_holds_the_device_for_the_block_only_even_when_it_fails(loop_device):
    devno = diskmodel.dev_numbers(loop_device)
    with diskmodel.throttled(HDD, [loop_device]):
        assert sorted(_rules(devno)) == sorted([f"{devno} 150", f"{devno} 150", f"{devno} 160000000",
                                                 f"{devno} 160000000"])
    assert _rules(devno) == []
    with pytest.raises(RuntimeError):
        with diskmodel.throttled(HDD, [loop_device]):
            raise RuntimeError("a case failed")
    assert _rules(devno) == []
    with diskmodel.throttled(DiskModel("fast", 150, 160.0, 8.3), [loop_device]):
        assert _rules(devno) == []  # the fast model throttles nothing


def _write_and_fsync(dev: str) -> diskmodel.IoCount:
    """Eight 4 KiB direct writes far apart (never merged into one request) and an fsync."""
    with diskmodel.IoMeter(dev) as meter:
        fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
        try:
            block = mmap.mmap(-1, 4096)  # O_DIRECT wants an aligned buffer
            for i in range(8):
                os.pwrite(fd, block, i * (1 << 20))
            os.fsync(fd)
        finally:
            os.close(fd)
    return meter.io


def test_a_meter_counts_the_requests_a_device_completes(loop_device):
    io = _write_and_fsync(loop_device)
    assert io.writes >= 8 and io.write_bytes >= 8 * 4096 and io.flushes >= 1


def test_the_modelled_drive_writes_through_for_the_block_only(loop_device):
    queue = Path(f"/sys/block/{os.path.basename(loop_device)}/queue/write_cache")
    assert queue.read_text().strip() == "write back"
    with pytest.raises(RuntimeError):
        with diskmodel.throttled(HDD, [loop_device]):
            assert queue.read_text().strip() == "write through"
            io = _write_and_fsync(loop_device)
            raise RuntimeError("a case failed")
    assert io.writes == 8 and io.flushes == 0  # the fsync costs the drive nothing of its own
    assert queue.read_text().strip() == "write back"
    with diskmodel.throttled(DiskModel("hdd", 150, 160.0, 8.3, write_cache=True), [loop_device]):
        assert queue.read_text().strip() == "write back"


def test_release_undoes_what_an_interrupted_run_left_on_one_device(loop_device):
    devno = diskmodel.dev_numbers(loop_device)
    queue = Path(f"/sys/block/{os.path.basename(loop_device)}/queue/write_cache")
    diskmodel._set(devno, 150, 160_000_000)  # as a run killed inside throttled() leaves it
    queue.write_text("write through")
    diskmodel.release(loop_device)
    assert _rules(devno) == [] and queue.read_text().strip() == "write back"
