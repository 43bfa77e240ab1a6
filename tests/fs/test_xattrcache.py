"""Xattrs answered in C (option xattrcache, packfs/fuse/fuseshim.py) on a real mount.

The point is fewer requests through pyfuse3: once packfs has answered a getxattr, the
next ones of that file are answered by the fuse shim from the xattrs it was handed. The
promise is that nothing else changes: the same values, sizes, ERANGE and ENODATA, a
change or removal is seen at once, a reused inode number never shows the xattrs of the
file that had it before, and noxattrcache sends every getxattr to packfs again.
"""
from __future__ import annotations

import ctypes
import errno
import os

import pytest

from mounts import mounted, requests_served, stats

_libc = ctypes.CDLL(None, use_errno=True)
_libc.getxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.getxattr.restype = ctypes.c_ssize_t
_libc.listxattr.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.listxattr.restype = ctypes.c_ssize_t


def _getxattr(path, name: str, size: int) -> int | bytes:
    """getxattr(2) with a buffer of `size` bytes: the value's size when size is 0, else the value."""
    buf = ctypes.create_string_buffer(size) if size else None
    n = _libc.getxattr(os.fsencode(path), name.encode(), buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return n if not size else buf.raw[:n]


def _in_shim(m) -> int:
    return stats(m)["xattrs_answered_in_shim"]


def test_xattrs_read_again_come_from_the_shim_and_stay_right(mnt):
    assert stats(mnt)["xattrs_from_shim"] is True
    f = mnt / "obj.data"
    f.write_bytes(b"data")
    meta = bytes(range(256)) + b"\0tail"  # any bytes, NULs included
    os.setxattr(f, "user.swift.metadata", meta)
    os.setxattr(f, "user.swift.metadata_checksum", b"abc")
    assert os.getxattr(f, "user.swift.metadata") == meta  # packfs answers, and hands them over
    before = _in_shim(mnt)
    served = requests_served(mnt).get("getxattr", 0)
    assert _getxattr(f, "user.swift.metadata", 0) == len(meta)
    assert _getxattr(f, "user.swift.metadata", 4096) == meta
    with pytest.raises(OSError) as e:
        _getxattr(f, "user.swift.metadata", len(meta) - 1)
    assert e.value.errno == errno.ERANGE
    assert _getxattr(f, "user.swift.metadata_checksum", 3) == b"abc"
    with pytest.raises(OSError) as e:
        _getxattr(f, "user.swift.metadata1", 0)
    assert e.value.errno == errno.ENODATA
    assert _in_shim(mnt) - before == 5
    assert requests_served(mnt).get("getxattr", 0) == served, "a getxattr reached packfs's handler"

    # A change is seen at once, and so is a removal.
    os.setxattr(f, "user.swift.metadata", b"new")
    assert os.getxattr(f, "user.swift.metadata") == b"new"
    assert os.getxattr(f, "user.swift.metadata") == b"new"
    os.removexattr(f, "user.swift.metadata_checksum")
    for _ in range(2):
        with pytest.raises(OSError) as e:
            os.getxattr(f, "user.swift.metadata_checksum")
        assert e.value.errno == errno.ENODATA
    assert sorted(os.listxattr(f)) == ["user.swift.metadata"]


def test_an_absent_xattr_hands_the_file_over_too(mnt):
    """The kernel asks for security.capability before every cached write to a file
    (Swift's append to a partition's hashes.invalid in each PUT): once packfs has said
    ENODATA, the shim answers the next ones (with metacache, the first too)."""
    f = mnt / "hashes.invalid"
    f.write_bytes(b"")
    os.setxattr(f, "user.a", b"1")
    os.removexattr(f, "user.a")  # no longer a file packfs just made: those are answered anyway
    served = requests_served(mnt).get("getxattr", 0)
    for _ in range(3):
        with pytest.raises(OSError) as e:
            os.getxattr(f, "security.capability")
        assert e.value.errno == errno.ENODATA
    by_packfs = 0 if stats(mnt)["metadata_from_shim"] else 1  # (metacache: the first is taken from the table)
    assert requests_served(mnt).get("getxattr", 0) == served + by_packfs
    os.setxattr(f, "security.capability", b"\1\0\0\2" + bytes(16))  # a change takes them back
    assert os.getxattr(f, "security.capability") == b"\1\0\0\2" + bytes(16)


def test_a_reused_inode_number_never_shows_the_xattrs_of_the_file_before(mnt):
    seen: dict[int, int] = {}
    for i in range(300):
        f = mnt / f"f{i}"
        fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        ino = os.stat(f).st_ino
        seen[ino] = seen.get(ino, 0) + 1
        if i % 2:
            for _ in range(2):  # the second from the shim, if the first handed them over
                with pytest.raises(OSError) as e:
                    os.getxattr(f, "user.k")
                assert e.value.errno == errno.ENODATA, f"file {i} (inode {ino}) shows another file's xattr"
        else:
            os.setxattr(f, "user.k", b"v%d" % i)
            for _ in range(2):
                assert os.getxattr(f, "user.k") == b"v%d" % i, f"file {i} (inode {ino})"
        os.unlink(f)
    assert max(seen.values()) > 10, f"inode numbers were not reused: {len(seen)} numbers for 300 files"
    assert _in_shim(mnt) >= 150


def test_noxattrcache_sends_every_getxattr_to_packfs(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrcache") as m:
        f = m / "f"
        f.write_bytes(b"x")
        os.setxattr(f, "user.a", b"1")
        served = requests_served(m).get("getxattr", 0)
        for _ in range(3):
            assert os.getxattr(f, "user.a") == b"1"
        assert requests_served(m).get("getxattr", 0) - served == 3
        assert _in_shim(m) == 0 and stats(m)["xattrs_from_shim"] is False


def test_xattrs_past_the_cache_limit_are_answered_by_packfs(mnt):
    """One inode may hold 16 MiB of xattrs; the shim keeps an inode's only up to
    CACHED_XATTRS_MAX, else every getxattr would copy them all into it."""
    from packfs.fuse.tablelayout import CACHED_XATTRS_MAX
    f = mnt / "big"
    f.write_bytes(b"x")
    values = {f"user.{i}": bytes([i]) * 60_000 for i in range(3)}
    for name, value in values.items():
        os.setxattr(f, name, value)
    assert sum(map(len, values.values())) > CACHED_XATTRS_MAX
    before = _in_shim(mnt)
    for _ in range(3):
        for name, value in values.items():
            assert os.getxattr(f, name) == value
    assert _in_shim(mnt) == before


def _listxattr(path, size: int) -> int | bytes:
    """listxattr(2) with a buffer of `size` bytes: the names' size when size is 0, else the names."""
    buf = ctypes.create_string_buffer(size) if size else None
    n = _libc.listxattr(os.fsencode(path), buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return n if not size else buf.raw[:n]


def test_listxattr_comes_from_the_shim_and_stays_right(mnt):
    f, bare = mnt / "obj.data", mnt / "bare"
    f.write_bytes(b"data")
    bare.write_bytes(b"")
    names = ["user.swift.metadata", "user.swift.metadata_checksum", "trusted.t", "user.x" * 40]
    for i, name in enumerate(names):
        os.setxattr(f, name, b"v" * i)
    assert os.listxattr(f) == names  # packfs's order: as set
    before, served = stats(mnt)["listxattrs_answered_in_shim"], requests_served(mnt).get("listxattr", 0)
    want = b"".join(n.encode() + b"\0" for n in names)
    assert _listxattr(f, 0) == len(want)
    assert _listxattr(f, 4096) == want
    with pytest.raises(OSError) as e:
        _listxattr(f, len(want) - 1)
    assert e.value.errno == errno.ERANGE
    assert os.listxattr(bare) == [] and os.listxattr(bare) == []
    assert stats(mnt)["listxattrs_answered_in_shim"] - before >= 4
    assert requests_served(mnt).get("listxattr", 0) - served <= 1, "only a first listxattr of `bare` reaches packfs"
    os.removexattr(f, "trusted.t")  # a change is seen at once
    assert os.listxattr(f) == [n for n in names if n != "trusted.t"]
