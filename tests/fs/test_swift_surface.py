"""The rest of the POSIX surface Swift touches: O_TMPFILE, fallocate, flock, mmap."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os

from fsutil import raises_errno, read_file, write_file

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def test_o_tmpfile_refused_or_exact(work):
    """Either refuse O_TMPFILE (Swift falls back to mkstemp) or honour linkat exactly."""
    try:
        fd = os.open(work, os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError as e:
        assert e.errno in (errno.EOPNOTSUPP, errno.EISDIR), errno.errorcode.get(e.errno)
        assert os.listdir(work) == []
        return
    try:
        os.write(fd, b"tmpfile contents")
        os.fsync(fd)
        os.link(f"/proc/self/fd/{fd}", work / "linked", follow_symlinks=True)
    finally:
        os.close(fd)
    assert read_file(work / "linked") == b"tmpfile contents"


def test_fallocate_unsupported_is_harmless(work):
    """pyfuse3 has no fallocate: EOPNOTSUPP (Swift ignores it), and the file is untouched."""
    write_file(work / "f", b"abc")
    fd = os.open(work / "f", os.O_RDWR)
    try:
        rc = _libc.fallocate(fd, 0, 0, 1 << 20)
        e = ctypes.get_errno()
        if rc != 0:
            assert e in (errno.EOPNOTSUPP, errno.ENOSYS), errno.errorcode.get(e)
        else:
            assert os.fstat(fd).st_size == 1 << 20
    finally:
        os.close(fd)
    data = read_file(work / "f")
    assert data[:3] == b"abc" and not any(data[3:])


def test_flock_exclusive_nonblocking(work):
    write_file(work / ".lock", b"")
    fd1 = os.open(work / ".lock", os.O_RDWR)
    fd2 = os.open(work / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with raises_errno(errno.EWOULDBLOCK):
            fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd1, fcntl.LOCK_UN)
        fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd1)
        os.close(fd2)


def test_fcntl_record_locks(work):
    write_file(work / "f", b"x" * 100)
    fd = os.open(work / "f", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
    finally:
        os.close(fd)


def test_mmap_shared_write_and_read(work):
    write_file(work / "f", bytes(8192))
    fd = os.open(work / "f", os.O_RDWR)
    try:
        with mmap.mmap(fd, 8192) as m:
            m[100:105] = b"hello"
            m.flush()
        os.fsync(fd)
    finally:
        os.close(fd)
    data = read_file(work / "f")
    assert data[100:105] == b"hello" and len(data) == 8192
    with open(work / "f", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[100:105] == b"hello"
