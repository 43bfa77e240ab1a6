"""Attributes answered in C (option attrcache, packfs/fuseshim.py) on a real mount.

The kernel forgets a directory's attributes whenever an entry in it changes, and asks
for them again (GETATTR) at its next path walk through it. packfs hands the fuse shim
the attributes of the directories a request changed, and the shim answers that
GETATTR. The promise is that nothing else changes: the same attributes as packfs's own
getattr gives (after a remount, where every getattr reaches packfs), a change made after
the hand-over is seen at once, and noattrcache sends every getattr to packfs again.
"""
from __future__ import annotations

import os

from fsutil import fsync_dir, link_fd
from mounts import mount, mounted, requests_served, stats, umount


def _in_shim(m) -> int:
    return stats(m)["attrs_answered_in_shim"]


def _served(m) -> int:
    return requests_served(m).get("getattr", 0)


def _attrs(st: os.stat_result) -> tuple:
    return (st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_blocks, st.st_blksize,
            st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_rdev)


def test_a_changed_directory_is_stat_from_the_shim_as_packfs_would_answer(tmp_path):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    with mounted(pack, mnt) as m:
        assert stats(m)["attrs_from_shim"] is True
        os.mkdir(m / "d")
        before, served = _in_shim(m), _served(m)
        # A Swift PUT into a new partition: each mkdir changes the directory above it,
        # then the object is written with no name and linked into place.
        os.makedirs(m / "d" / "part" / "suffix" / "hash")
        fd = os.open(m / "d" / "part" / "suffix" / "hash", os.O_TMPFILE | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            link_fd(fd, m / "d" / "part" / "suffix" / "hash" / "1.data")
        finally:
            os.close(fd)
        fsync_dir(m / "d" / "part" / "suffix" / "hash")
        paths = [m / "d", m / "d" / "part", m / "d" / "part" / "suffix", m / "d" / "part" / "suffix" / "hash",
                 m / "d" / "part" / "suffix" / "hash" / "1.data"]
        seen = {p: _attrs(os.stat(p)) for p in paths}
        assert _in_shim(m) - before >= 4, "the changed directories' getattrs did not come from the shim"
        assert _served(m) == served, "a getattr of a changed directory reached packfs's handler"
        assert seen[m / "d"][2] == 3 and seen[m / "d" / "part" / "suffix" / "hash" / "1.data"][2] == 1
    mount(pack, mnt)  # a fresh kernel: every getattr reaches packfs
    try:
        assert {p: _attrs(os.stat(p)) for p in paths} == seen
        assert _in_shim(mnt) == 0
    finally:
        umount(pack, mnt)


def test_a_change_after_the_hand_over_is_seen_at_once(mnt):
    """A setxattr makes the kernel forget only the ctime it had, so its next stat asks
    packfs: the shim must not answer from the copy it was handed before."""
    d = mnt / "d"
    os.mkdir(d)
    os.mkdir(d / "sub")  # hands d over
    first = os.stat(d)
    os.setxattr(d, "user.k", b"v")
    served = _served(mnt)
    second = os.stat(d)
    assert second.st_ctime_ns > first.st_ctime_ns
    assert _served(mnt) == served + 1
    os.rmdir(d / "sub")  # hands d over again, as it is now
    third = os.stat(d)
    assert (third.st_nlink, third.st_ctime_ns >= second.st_ctime_ns) == (2, True)
    assert _served(mnt) == served + 1

    # A file linked (handed over with its directory), then written through a handle.
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        link_fd(fd, d / "f")
        assert os.stat(d / "f").st_size == 0
        os.pwrite(fd, b"y" * 5000, 0)
        assert os.stat(d / "f").st_size == os.fstat(fd).st_size == 5000
    finally:
        os.close(fd)
    os.chmod(d / "f", 0o640)
    os.link(d / "f", d / "g")
    st = os.stat(d / "f")
    assert (st.st_nlink, st.st_mode & 0o777, st.st_size) == (2, 0o640, 5000)


def test_noattrcache_sends_every_getattr_to_packfs(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "noattrcache") as m:
        os.mkdir(m / "d")
        os.mkdir(m / "d" / "sub")
        served = _served(m)
        os.stat(m / "d")
        assert _served(m) - served == 1
        assert _in_shim(m) == 0 and stats(m)["attrs_from_shim"] is False
