"""fallocate(2): the modes packfs serves (the fuse shim hands them over, fuseshim.py).

Swift reserves an object's size with FALLOC_FL_KEEP_SIZE before it writes, and punches
holes with FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE. Packed data has no blocks to set
aside for one file, so a reservation is a check that the disk has the room now.
"""
from __future__ import annotations

import errno
import os
import struct

from fsutil import FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE, fallocate, raises_errno, read_file
from mounts import mount, mounted, requests_served, stats, umount

PUNCH = FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE
MiB = 1 << 20


def test_a_reservation_keeps_the_size_and_changes_the_times(work):
    with open(work / "f", "wb") as f:
        f.write(b"abc")
        f.flush()
        before = os.fstat(f.fileno())
        fallocate(f.fileno(), FALLOC_KEEP_SIZE, 0, 10 * MiB)
        after = os.fstat(f.fileno())
    assert after.st_size == 3
    assert after.st_mtime_ns > before.st_mtime_ns and after.st_ctime_ns > before.st_ctime_ns  # as ext4 and XFS


def test_allocating_past_the_end_grows_the_file_with_zeros(work):
    with open(work / "f", "wb") as f:
        f.write(b"abc")
        f.flush()
        before = os.fstat(f.fileno())
        fallocate(f.fileno(), 0, 1000, 5000)
        after = os.fstat(f.fileno())
        fallocate(f.fileno(), 0, 0, 100)  # within the file: nothing changes
        assert os.fstat(f.fileno()).st_size == 6000
    assert after.st_size == 6000
    assert after.st_mtime_ns > before.st_mtime_ns
    assert read_file(work / "f") == b"abc" + bytes(5997)


def test_a_punched_hole_reads_zeros_and_survives_a_remount(tmp_path):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    data = os.urandom(3 * MiB)
    with mounted(pack, mnt):
        fd = os.open(mnt / "f", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, data)  # the last MiB may still be buffered in packfs: the hole cuts it too
            fallocate(fd, PUNCH, MiB - 100, MiB + 200)
            fallocate(fd, PUNCH, 3 * MiB - 10, 5 * MiB)  # past the end: the size stays
            os.fsync(fd)
            assert os.fstat(fd).st_size == len(data)
        finally:
            os.close(fd)
        expect = data[:MiB - 100] + bytes(MiB + 200) + data[2 * MiB + 100:3 * MiB - 10] + bytes(10)
        assert read_file(mnt / "f") == expect
        umount(pack, mnt)
        mount(pack, mnt)
        assert read_file(mnt / "f") == expect
        fd = os.open(mnt / "f", os.O_RDWR)
        live = stats(mnt)["live_bytes"]
        try:
            fallocate(fd, PUNCH, 0, 3 * MiB)  # every record loses its last extent
        finally:
            os.close(fd)
        assert read_file(mnt / "f") == bytes(len(data))
        assert stats(mnt)["live_bytes"] < live - 2 * MiB


def test_a_zeroed_range_reads_zeros_and_may_grow_the_file(work):
    data = os.urandom(10_000)
    with open(work / "f", "w+b") as f:
        f.write(data)
        f.flush()
        fallocate(f.fileno(), FALLOC_ZERO_RANGE, 5000, 1000)
        fallocate(f.fileno(), FALLOC_ZERO_RANGE | FALLOC_KEEP_SIZE, 9000, 5000)
        assert os.fstat(f.fileno()).st_size == 10_000
        fallocate(f.fileno(), FALLOC_ZERO_RANGE, 9500, 1000)
        assert os.fstat(f.fileno()).st_size == 10_500
    assert read_file(work / "f") == data[:5000] + bytes(1000) + data[6000:9000] + bytes(1500)


def test_no_room_is_enospc(work):
    with open(work / "f", "wb") as f:
        with raises_errno(errno.ENOSPC):
            fallocate(f.fileno(), FALLOC_KEEP_SIZE, 0, 1 << 50)
        with raises_errno(errno.ENOSPC):
            fallocate(f.fileno(), 0, 0, 1 << 50)
    assert os.stat(work / "f").st_size == 0


def test_the_kernels_capability_probe_before_a_new_files_reservation_is_answered_in_c(work, shared_mount):
    """The kernel asks getxattr("security.capability") of a file before its first
    fallocate; a file just made has no xattrs, and the fuse shim is told so at once."""
    _, m = shared_mount
    served, in_shim = requests_served(m).get("getxattr", 0), stats(m)["xattrs_answered_in_shim"]
    for _ in range(3):  # as Swift writes an object
        fd = os.open(work, os.O_TMPFILE | os.O_WRONLY, 0o600)
        try:
            fallocate(fd, FALLOC_KEEP_SIZE, 0, 4096)
            os.write(fd, b"x" * 4096)
        finally:
            os.close(fd)
    assert requests_served(m).get("getxattr", 0) == served
    assert stats(m)["xattrs_answered_in_shim"] == in_shim + 3
    # Only the kernel's probe: a new file's other xattrs go to packfs (its first read of
    # a file's xattrs starts the prefetch), or with metacache to the shim's reading of the
    # inode table, which starts it too; and a capability set later is seen.
    (work / "named").write_bytes(b"")
    with raises_errno(errno.ENODATA):
        os.getxattr(work / "named", "user.swift.metadata")
    from_table = stats(m)["metadata_from_shim"]
    assert requests_served(m).get("getxattr", 0) == served + (0 if from_table else 1)
    cap = struct.pack("<5I", 0x02000000, 1 << 10, 0, 0, 0)  # VFS_CAP_REVISION_2: CAP_NET_BIND_SERVICE
    os.setxattr(work / "named", "security.capability", cap)
    assert os.getxattr(work / "named", "security.capability") == cap


def test_a_user_cannot_pass_a_setxattr_for_a_fallocate(work):
    (work / "f").write_bytes(b"data")
    for value in (b"", b"x" * 36, bytes(36)):
        with raises_errno(errno.EOPNOTSUPP):
            os.setxattr(work / "f", "packfs.fallocate", value)
    assert read_file(work / "f") == b"data"


def test_the_option_turns_it_off(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "nofallocate") as m:
        with open(m / "f", "wb") as f:
            with raises_errno(errno.EOPNOTSUPP):
                fallocate(f.fileno(), FALLOC_KEEP_SIZE, 0, 4096)
        assert stats(m)["fallocate"] is False
