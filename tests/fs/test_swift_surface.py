"""The rest of the POSIX surface Swift touches: flock, mmap (O_TMPFILE and fallocate have
test_tmpfile.py and test_fallocate.py)."""
from __future__ import annotations

import errno
import fcntl
import mmap
import os

from fsutil import raises_errno, read_file, write_file

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
