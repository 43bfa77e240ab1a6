"""Access times under each atime mode: packfs keeps atime itself (the kernel marks a FUSE
inode S_NOATIME and only asks for the attributes again after a read that reached the
daemon), by the kernel's relatime rule unless the mount says noatime or strictatime.
Reads here reach packfs: each drops the file's cached pages first (fsutil.read_file)."""
from __future__ import annotations

import os
import time

import pytest

from fsutil import drop_cache, read_file, write_file
from mounts import mounted, stats

SECOND = 10**9
DAY = 24 * 3600 * SECOND


def _age(path, atime_before_mtime: int) -> tuple[int, int]:
    """Set atime that far before mtime (older than mtime and ctime, as after a write);
    returns (atime, mtime)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_mtime_ns - atime_before_mtime, st.st_mtime_ns))
    return st.st_mtime_ns - atime_before_mtime, st.st_mtime_ns


def _mount_line(mnt) -> list[str]:
    with open("/proc/mounts") as f:
        return next(line.split()[3].split(",") for line in f if line.split()[1] == str(mnt))


def test_relatime_is_the_default(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        assert "relatime" in _mount_line(mnt)
        f = mnt / "f"
        write_file(f, b"x" * 10_000)
        _age(f, SECOND)
        before = time.time_ns()
        read_file(f)
        first = os.stat(f).st_atime_ns
        assert first >= before, "a read of a file whose atime is older than its mtime left atime alone"
        read_file(f)
        assert os.stat(f).st_atime_ns == first, "relatime updated an atime newer than mtime and ctime, < 24 h old"
        # A day-old atime is updated even though mtime and ctime are older still.
        os.utime(f, ns=(time.time_ns() - DAY - SECOND, time.time_ns() - 2 * DAY))
        read_file(f)
        assert os.stat(f).st_atime_ns >= before
        # A write makes mtime newer than atime: the next read updates it again.
        os.utime(f, ns=(time.time_ns() - SECOND, time.time_ns() - 2 * SECOND))
        write_file(f, b"y" * 100)
        written = os.stat(f)
        read_file(f)
        assert os.stat(f).st_atime_ns > written.st_mtime_ns


def test_strictatime_updates_on_every_read(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "strictatime"):
        f = mnt / "f"
        write_file(f, b"x" * 10_000)
        seen = []
        for _ in range(3):
            read_file(f)
            seen.append(os.stat(f).st_atime_ns)
        assert seen[0] > os.stat(f).st_mtime_ns
        assert seen[0] < seen[1] < seen[2], seen


def test_noatime_never_updates(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "noatime"):
        assert "noatime" in _mount_line(mnt)
        f = mnt / "f"
        write_file(f, b"x" * 10_000)
        old, _ = _age(f, DAY)
        (mnt / "d").mkdir()
        os.utime(mnt / "d", ns=(1, 2))
        for _ in range(2):
            read_file(f)
            os.listdir(mnt / "d")
        assert os.stat(f).st_atime_ns == old
        assert os.stat(mnt / "d").st_atime_ns == 1


@pytest.mark.parametrize("options", ["strictatime", "strictatime,nofilecache"])
def test_o_noatime_reads_leave_atime_alone(tmp_path, packdir, options):
    """With filecache no OPEN comes: the fuse shim marks reads through an O_NOATIME file."""
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, options):
        f = mnt / "f"
        write_file(f, b"x" * 10_000)
        old, _ = _age(f, SECOND)
        fd = os.open(f, os.O_RDONLY | os.O_NOATIME)
        try:
            drop_cache(fd)
            assert os.read(fd, 20_000) == b"x" * 10_000
        finally:
            os.close(fd)
        assert os.stat(f).st_atime_ns == old
        read_file(f)  # the same file read without O_NOATIME
        assert os.stat(f).st_atime_ns > old


def test_listing_and_readlink_update_atime(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        d = mnt / "d"
        d.mkdir()
        (d / "a").write_bytes(b"a")
        os.symlink("a", d / "s")
        os.utime(d, ns=(1, 2))
        os.utime(d / "s", ns=(1, 2), follow_symlinks=False)
        assert sorted(os.listdir(d)) == ["a", "s"]
        assert os.stat(d).st_atime_ns > 2
        os.readlink(d / "s")
        assert os.lstat(d / "s").st_atime_ns > 2


def test_an_atime_update_costs_no_flush_and_is_committed_later(tmp_path, packdir):
    """The update is an ordinary inode change: the read does not wait for the device, and
    the change goes with the next commit (here the unmount's)."""
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "commit_interval=0"):
        f = mnt / "f"
        write_file(f, b"x" * 10_000, fsync=True)
        _age(f, SECOND)
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        before = stats(mnt)
        assert before["uncommitted_inodes"] == 0
        read_file(f)
        after = stats(mnt)
        updated = os.stat(f).st_atime_ns
        assert updated > os.stat(f).st_mtime_ns
        assert after["device_flushes"] == before["device_flushes"]
        assert after["commits"] == before["commits"]
        assert after["uncommitted_inodes"] == 1
    with mounted(packdir, mnt, "noatime"):  # (the unmount above committed it)
        assert os.stat(mnt / "f").st_atime_ns == updated
