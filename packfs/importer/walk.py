"""The source tree as a stream of items, in the order the builder makes its inodes.

It runs in the reader process (reader.py), so that reading SOURCE (a third to a half
of an import's system calls) takes the second core while the builder makes inodes.
Every read goes through source.py. The items are plain tuples of bytes and ints, which
marshal carries cheaply; their first field says which kind an item is:

START  (START, mode, uid, gid, atime, mtime, ctime): the root, first; directory 0.
DIR    (DIR, number, xattrs): the entries up to the next END are those of the directory
       the number names (directories are numbered as they are met, from 1).
END    (END,): the directory's entries are all sent: its times may be set.
NODE   (NODE, name, mode, uid, gid, rdev, size, atime, mtime, ctime, xattrs, content, key):
       an entry to make. content: a regular file's data as (offset, bytes) pieces (holes
       left out), or None for a file of more than INLINE_BYTES, whose PIECE items follow,
       then its FILE_END; a symlink's target; None for anything else. key: (st_dev,
       st_ino) of a regular file with several names, for its links; else None.
PIECE  (PIECE, offset, bytes): the next run of data of the file being sent.
FILE_END (FILE_END,): the large file's data is all sent.
LINK   (LINK, name, key, atime, mtime, ctime): another name of a file sent before.

Directories are walked depth first and each one's entries are sent as it is listed, so
neither side holds a directory of millions of entries whole; the builder numbers the
directories it makes as they come, as this walk does.
"""
from __future__ import annotations

import os
import stat
from typing import Iterator

from . import source
from .errors import ImportFailed
from .source import SourceDir, show

START, DIR, END, NODE, PIECE, FILE_END, LINK = range(7)
# A regular file up to this size travels in its NODE item; a larger one in PIECE items,
# so no item (and no batch of them) holds a large file whole.
INLINE_BYTES = 64 * 1024

Item = tuple


def items(root: bytes, piece: int) -> Iterator[Item]:
    """The tree under root (a directory) as items; data in pieces of at most `piece` bytes.
    Raises ImportFailed, naming the file, for what cannot be read or kept."""
    try:
        st = os.lstat(root)
    except OSError as e:
        raise source.failed(root, e) from None
    yield START, st.st_mode, st.st_uid, st.st_gid, st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
    seen: set[tuple[int, int]] = set()  # files of several names sent so far
    todo = [(0, root)]
    numbered = 0
    while todo:
        number, path = todo.pop()
        subdirs = []
        d = SourceDir(path)
        try:
            yield DIR, number, source.xattrs(d.fd, path)
            for name, est in d.entries():
                mode = est.st_mode
                if stat.S_ISDIR(mode):
                    numbered += 1
                    subdirs.append((numbered, path + b"/" + name))
                    yield _node(name, est, [], None, None)
                elif stat.S_ISREG(mode):
                    key = (est.st_dev, est.st_ino) if est.st_nlink > 1 else None
                    if key is None or key not in seen:
                        yield from _file(d, name, est, key, piece)
                        if key is not None:
                            seen.add(key)
                    else:
                        yield LINK, name, key, est.st_atime_ns, est.st_mtime_ns, est.st_ctime_ns
                elif stat.S_ISLNK(mode):
                    yield _node(name, est, d.xattrs_of(name), d.readlink(name), None)
                elif source.is_special(mode):
                    yield _node(name, est, d.xattrs_of(name), None, None)
                else:
                    raise ImportFailed(f"{show(path + b'/' + name)} is of a file type packfs does not keep "
                                       f"(mode {mode:o})")
        finally:
            d.close()
        yield END,
        todo += reversed(subdirs)


def _node(name: bytes, st: os.stat_result, xattrs: list[tuple[bytes, bytes]], content: object,
          key: tuple[int, int] | None) -> Item:
    return (NODE, name, st.st_mode, st.st_uid, st.st_gid, st.st_rdev, st.st_size, st.st_atime_ns,
            st.st_mtime_ns, st.st_ctime_ns, xattrs, content, key)


def _file(d: SourceDir, name: bytes, st: os.stat_result, key: tuple[int, int] | None, piece: int) -> Iterator[Item]:
    """A regular file's items: its NODE with its data, or its NODE, PIECEs and FILE_END."""
    path = d.path + b"/" + name
    fd = d.open(name)
    try:
        if st.st_size <= INLINE_BYTES:
            data = list(source.pieces(fd, st, piece, path))
            yield _node(name, st, source.xattrs(fd, path), data, key)
        else:
            yield _node(name, st, source.xattrs(fd, path), None, key)
            for offset, data in source.pieces(fd, st, piece, path):
                yield PIECE, offset, data
            yield FILE_END,
    finally:
        os.close(fd)
