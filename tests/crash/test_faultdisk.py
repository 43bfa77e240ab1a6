"""FaultDisk itself: durability per file, power cuts, torn writes, replay of a trace, faults."""
from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from faultdisk import PAGE, FaultDisk


def disk_with_file(tmp_path: Path) -> tuple[FaultDisk, int, str]:
    d = FaultDisk(str(tmp_path))
    fd = d.open(str(tmp_path / "v" / "f"), create=True)
    return d, fd, "v/f"


def test_flushed_data_survives_and_unflushed_may_not(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    d.fsync_dir(str(tmp_path / "v"))
    d.pwrite(fd, b"a" * 8192, 0)
    d.fdatasync(fd)
    d.pwrite(fd, b"b" * 8192, 8192)
    assert d.read_file(rel) == b"a" * 8192 + b"b" * 8192
    assert d.read_file(rel, durable=True) == b"a" * 8192
    none, _ = d.power_cut(mode="none")
    assert none.read_file(rel) == b"a" * 8192
    every, _ = d.power_cut(mode="all")
    assert every.read_file(rel) == b"a" * 8192 + b"b" * 8192
    # A flush of one file flushes nothing of another.
    fd2 = d.open(str(tmp_path / "v" / "g"), create=True)
    d.pwrite(fd2, b"g" * 100, 0)
    d.fdatasync(fd)
    assert d.files["v/g"].pending


def test_unsynced_names_may_vanish_and_unlinks_may_be_lost(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    d.pwrite(fd, b"x" * 10, 0)
    d.fdatasync(fd)
    cut, rep = d.power_cut(mode="none")
    assert rel not in cut.files and rep.files_dropped == [rel]  # never named durably
    d.fsync_dir(str(tmp_path / "v"))
    d.close(fd)
    d.remove(str(tmp_path / "v" / "f"))
    assert d.listdir(str(tmp_path / "v")) == []
    back, rep = d.power_cut(mode="none")
    assert back.read_file(rel) == b"x" * 10 and rep.files_back == [rel]
    d.fsync_dir(str(tmp_path / "v"))
    gone, _ = d.power_cut(mode="none")
    assert rel not in gone.files


def test_torn_writes_keep_only_whole_sectors_of_the_write(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    d.fsync_dir(str(tmp_path / "v"))
    old = bytes(range(256)) * 64  # 16 KiB
    d.pwrite(fd, old, 0)
    d.fdatasync(fd)
    new = b"\xff" * len(old)
    d.pwrite(fd, new, 0)
    rng = random.Random(1)
    shapes = set()
    for _ in range(300):
        cut, rep = d.power_cut(rng, p_torn=1.0)
        data = cut.read_file(rel)
        assert len(data) == len(old)
        for s in range(0, len(old), 512):  # every 512 B sector is all old or all new
            assert data[s:s + 512] in (old[s:s + 512], new[s:s + 512])
        shapes.add(tuple(data[s] == 0xff for s in range(0, len(old), 512)))
        assert rep.torn == 1
    assert len(shapes) > 20  # prefixes, suffixes and scattered subsets
    assert not any(all(s) for s in shapes)  # a torn write is never whole


def test_punch_truncate_allocate_are_pending_until_flushed(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    d.fsync_dir(str(tmp_path / "v"))
    d.allocate(fd, 0, 4 * PAGE)
    d.pwrite(fd, b"r" * PAGE, 0)
    d.pwrite(fd, b"s" * PAGE, PAGE)
    d.fdatasync(fd)
    d.punch_hole(fd, 0, PAGE)
    d.truncate(fd, 2 * PAGE)
    assert d.read_file(rel) == bytes(PAGE) + b"s" * PAGE
    assert d.has_data(fd)
    lost, rep = d.power_cut(mode="none")
    assert lost.read_file(rel) == b"r" * PAGE + b"s" * PAGE + bytes(2 * PAGE)
    assert rep.lost_punches == [(rel, 0, PAGE)]
    d.fdatasync(fd)
    kept, rep = d.power_cut(mode="none")
    assert kept.read_file(rel) == bytes(PAGE) + b"s" * PAGE and not rep.lost_punches


def test_replayer_rebuilds_every_prefix_of_the_trace(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    rng = random.Random(3)
    states = [d.snapshot()]
    for i in range(40):
        r = rng.random()
        if r < 0.5:
            d.pwrite(fd, rng.randbytes(rng.randrange(1, 9000)), rng.randrange(0, 30000))
        elif r < 0.6:
            d.truncate(fd, rng.randrange(0, 30000))
        elif r < 0.7:
            d.punch_hole(fd, rng.randrange(0, 8) * PAGE, PAGE)
        elif r < 0.9:
            d.fdatasync(fd)
        else:
            d.fsync_dir(str(tmp_path / "v"))
        states.append(d.snapshot())
    events = [ev for ev in d.trace if ev[0] != "mark"]
    assert len(events) == len(d.trace)
    for k, sim in FaultDisk.replayer(d.trace, str(tmp_path)):
        want = states[k - 1] if k else None  # trace[0] is the create
        if want is None or rel not in sim.files:
            continue
        got = sim.files[rel]
        assert got.live.read(0, got.live.size) == want.files[rel].live.read(0, want.files[rel].live.size)
        assert got.durable.read(0, got.durable.size) == want.files[rel].durable.read(0, want.files[rel].durable.size)


def test_faults_by_count_and_predicate_and_enospc(tmp_path: Path) -> None:
    d, fd, rel = disk_with_file(tmp_path)
    f = d.inject("fdatasync", errno.EIO, nth=2, times=2)
    d.fdatasync(fd)
    for _ in range(2):
        with pytest.raises(OSError) as e:
            d.fdatasync(fd)
        assert e.value.errno == errno.EIO
    d.fdatasync(fd)
    assert f.hits == 2
    d.inject("pread", errno.EIO, times=None, when=lambda path, off, n: off >= PAGE)
    d.pwrite(fd, b"z" * 2 * PAGE, 0)
    assert d.pread(fd, 10, 0) == b"z" * 10
    with pytest.raises(OSError):
        d.pread(fd, 10, PAGE)
    d.capacity = 4 * PAGE
    with pytest.raises(OSError) as e:
        d.allocate(fd, 0, 8 * PAGE)
    assert e.value.errno == errno.ENOSPC
    d.allocate(fd, 0, 4 * PAGE)
    assert d.statvfs(str(tmp_path)).f_bavail == 0
    with pytest.raises(OSError) as e:
        d.pwrite(fd, b"y", 4 * PAGE)
    assert e.value.errno == errno.ENOSPC
    d.pwrite(fd, b"y", 3 * PAGE)  # already allocated: fits
