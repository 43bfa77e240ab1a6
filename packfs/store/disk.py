"""The only module that performs OS I/O on the backing store.

Everything packfs writes to or reads from its volumes goes through a `Disk`, so that
tests can substitute one that records writes and flushes, injects errors and simulates
a power cut (see tests/faultdisk.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02

_ZERO_CHUNK = 1 << 20
_DIRECT_ALIGN = 4096
_DIRECT_ZEROS = mmap.mmap(-1, _ZERO_CHUNK)  # page-aligned zeros, as O_DIRECT wants

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


class Disk:
    """Real files on the backing filesystem. Methods may block: call them off the event loop
    (all but `pread_cached`)."""

    _nowait = hasattr(os, "RWF_NOWAIT")

    def open(self, path: str, create: bool = False) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o600)

    def open_unnamed(self, directory: str) -> int:
        """A new file with no name in directory (O_TMPFILE): it goes when its last
        descriptor is closed, and with a crash."""
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def prefetch(self, fd: int, length: int, offset: int) -> None:
        """Start reading a range into the page cache and return at once (advice: errors are
        ignored, a later read reports them)."""
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass

    def pread_cached(self, fd: int, length: int, offset: int) -> bytearray | None:
        """The bytes if the page cache holds all of them, else None; never waits for the disk.

        Lets the event loop serve warm reads itself (RWF_NOWAIT) instead of paying a
        worker-thread round trip (~100 us here) for a copy of a few microseconds. The
        buffer read into is handed over as it is (callers must not change it): a copy
        into bytes cost a 100 KiB read ~25 us more.
        """
        if not self._nowait:
            return None
        buf = bytearray(length)
        try:
            n = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait = False  # the backing filesystem cannot say: always use a thread
            return None
        return buf if n == length else None

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def punch_hole(self, fd: int, offset: int, length: int) -> None:
        """Free the blocks of [offset, offset+length) without changing the file size."""
        if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        """Reserve blocks for [offset, offset+length), extending the file (ENOSPC if none).

        Zeros are written rather than fallocated: appends into written blocks let
        fdatasync flush data alone, where unwritten extents make every flush also
        commit an extent conversion (measured on XFS: p50 0.15 ms against 0.3-0.45 ms).
        The zeros go around the page cache (O_DIRECT) where the backing filesystem
        allows it, so preallocating costs the daemon almost no CPU. With zeros=False
        the blocks are only fallocated (they read as zeros all the same): for a writer
        that is waiting, which should not wait for the zeros and their flush.
        """
        if not zeros:
            if _libc.fallocate(fd, 0, offset, length) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            return
        if offset % _DIRECT_ALIGN == 0 and length % _DIRECT_ALIGN == 0:
            try:
                direct = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
            else:
                try:
                    self._write_zeros(direct, offset, length, _DIRECT_ZEROS)
                    return
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                finally:
                    os.close(direct)
        self._write_zeros(fd, offset, length, bytes(min(length, _ZERO_CHUNK)))

    def _write_zeros(self, fd: int, offset: int, length: int, zeros: bytes | mmap.mmap) -> None:
        end = offset + length
        with memoryview(zeros) as view:
            while offset < end:
                n = min(len(view), end - offset)
                self.pwrite(fd, view[:n], offset)
                offset += n

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def holes(self, fd: int, start: int, end: int) -> list[tuple[int, int]]:
        """The holes of [start, end) as spans. XFS and ext4 report fallocated, unwritten
        blocks as holes too: where the log writes there, each flush converts extents."""
        spans = []
        pos = start
        while pos < end:
            try:
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError as e:
                if e.errno == errno.ENXIO:  # at or past the file's end
                    break
                raise
            if hole >= end:
                break
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                data = end  # a hole to the end of the file
            spans.append((hole, min(data, end)))
            pos = data
        return spans

    def allocated_bytes(self, fd: int) -> int:
        return os.fstat(fd).st_blocks * 512

    def has_data(self, fd: int) -> bool:
        """False once every block of the file is a hole."""
        try:
            os.lseek(fd, 0, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return False
            raise
        return True

    def remove(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def statvfs(self, path: str) -> os.statvfs_result:
        return os.statvfs(path)
