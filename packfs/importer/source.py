"""Reading the source tree: a directory's entries, an inode's xattrs, a file's data.

Everything the import reads of SOURCE goes through here, with as few system calls as a
warm tree allows: a directory is listed through its own descriptor, and its entries are
stat'ed and its files opened relative to it (fstatat, openat), so no full path is
resolved per file; a regular file's xattrs are read through its descriptor. Files and
directories are opened O_NOATIME where the kernel allows it, so the import leaves their
access times as they were; reading a symlink sets its own, after the import took it (a
source mounted read-only keeps every one). Nothing here writes.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Iterator

from .errors import ImportFailed

_NOATIME = getattr(os, "O_NOATIME", 0)
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class SourceDir:
    """One open directory of the source: its entries, and its files' opening."""

    def __init__(self, path: bytes) -> None:
        self.path = path
        self._listing: Iterator[os.DirEntry[str]] | None = None
        try:
            self.fd = _open_dir(path)
        except OSError as e:
            raise failed(path, e) from None

    def close(self) -> None:
        if self._listing is not None:
            self._listing.close()  # type: ignore[attr-defined]
        os.close(self.fd)

    def entries(self) -> Iterator[tuple[bytes, os.stat_result]]:
        """(name, lstat) of each entry, as the listing goes: a directory of millions of
        files is never held whole. Names given by a descriptor's listing are str with the
        undecodable bytes escaped; fsencode gives the exact bytes back."""
        try:
            self._listing = os.scandir(self.fd)
            for e in self._listing:
                yield os.fsencode(e.name), e.stat(follow_symlinks=False)
        except OSError as e:
            raise failed(self.path, e) from None

    def open(self, name: bytes) -> int:
        """A descriptor of the regular file `name` in this directory, for its data and xattrs."""
        try:
            return _open(name, 0, self.fd)
        except OSError as e:
            raise failed(self.path + b"/" + name, e) from None

    def readlink(self, name: bytes) -> bytes:
        try:
            return os.readlink(name, dir_fd=self.fd)
        except OSError as e:
            raise failed(self.path + b"/" + name, e) from None

    def xattrs_of(self, name: bytes) -> list[tuple[bytes, bytes]]:
        """The xattrs of the entry `name` (a symlink or special file, which is not opened),
        through this directory's descriptor: its full path may be longer than PATH_MAX."""
        return xattrs(b"/proc/self/fd/%d/%s" % (self.fd, name), self.path + b"/" + name)


def _open_dir(path: bytes) -> int:
    """A directory's descriptor; one deeper than PATH_MAX is opened a component at a time."""
    try:
        return _open(path, os.O_DIRECTORY)
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise
    fd = _open(b"/", os.O_DIRECTORY)
    try:
        for part in filter(None, path.split(b"/")):
            parent, fd = fd, -1
            try:
                fd = _open(part, os.O_DIRECTORY, parent)
            finally:
                os.close(parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def _open(path: bytes, flags: int, dir_fd: int | None = None) -> int:
    """Open for reading without touching atime: O_NOATIME needs the file's owner or
    CAP_FOWNER, so an import by another user opens without it."""
    global _NOATIME
    try:
        return os.open(path, _FLAGS | flags | _NOATIME, dir_fd=dir_fd)
    except PermissionError:
        if not _NOATIME:
            raise
        _NOATIME = 0
        return os.open(path, _FLAGS | flags, dir_fd=dir_fd)


def xattrs(target: int | bytes, path: bytes) -> list[tuple[bytes, bytes]]:
    """Every xattr of an open file (a descriptor), or of the inode a path names without
    following a symlink (symlinks and special files, which are not opened); path is for
    messages."""
    follow = isinstance(target, int)
    try:
        return [(os.fsencode(n), os.getxattr(target, n, follow_symlinks=follow))
                for n in os.listxattr(target, follow_symlinks=follow)]
    except OSError as e:
        if e.errno == errno.ENOTSUP:
            return []  # a source filesystem without xattrs has none to copy
        raise failed(path, e) from None


def pieces(fd: int, st: os.stat_result, piece: int, path: bytes) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of a regular file's data, in reads of at most `piece` bytes, holes
    skipped: a file with fewer blocks than its size asks SEEK_DATA and SEEK_HOLE where its
    data is; any other is read straight through. Raises ImportFailed if the file is
    shorter than its size said (it changed under the import)."""
    try:
        for start, end in data_ranges(fd, st.st_size) if st.st_blocks * 512 < st.st_size else [(0, st.st_size)]:
            pos = start
            while pos < end:
                data = os.pread(fd, min(piece, end - pos), pos)
                if not data:
                    raise ImportFailed(f"{show(path)} shrank while it was read: is SOURCE still in use?")
                yield pos, data
                pos += len(data)
    except OSError as e:
        raise failed(path, e) from None


def data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) of each run of data below size; the whole file where the filesystem
    cannot tell (EINVAL: no SEEK_DATA)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return  # nothing but a hole up to the end
            if e.errno == errno.EINVAL and pos == 0:
                yield 0, size
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        pos = end


def is_special(mode: int) -> bool:
    """A device node, FIFO or socket: packfs keeps its type and device number only."""
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def show(path: bytes) -> str:
    """A path for a message: undecodable bytes as \\x escapes, on one line."""
    return path.decode("utf-8", "backslashreplace").replace("\n", "\\n")


def failed(path: bytes, e: OSError) -> ImportFailed:
    return ImportFailed(f"cannot read {show(path)}: {e.strerror or e}")
