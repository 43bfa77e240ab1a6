"""Building a pack's tree from the source, through the core facade (Filesystem).

The tree is walked one directory at a time, depth first. A directory's entries are all
made while it is listed (so its own mtime and ctime, which each entry changes, are set
once they are all there); then its subdirectories are walked. Every inode gets the
source's type, mode, owner, size, device number or link target, xattrs and times (atime,
mtime and ctime, to the nanosecond); a file whose (st_dev, st_ino) was met before gets a
link to the inode made for it, not a copy. A regular file's data goes in as the source's
runs of data: holes stay holes.

Nothing is made durable file by file, and nothing is journaled. Small files' bytes wait
in the write-behind and go to the log writer a batch at a time, as one write. What
changed goes straight to the next checkpoint (as a commit hands it on, but with no META
record: a checkpoint's own commit would otherwise log every inode once more before the
catalog takes it; 100,000 Swift objects from tmpfs took 22.5-23.8 s of CPU without it,
25.6-25.7 with it, two alternated pairs on 2026-11-29 at 43d62a5). A checkpoint runs in
the background every CHECKPOINT_INODES inodes, beside the walk, so the change sets stay
bounded; the caller's final checkpoint makes it all durable at once. The pack is not a
pack until the import finishes (pack.IMPORTING), so a crash in the middle loses nothing
anyone relies on: the next import starts over.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from typing import Iterator

import trio

from ..core.filesystem import XATTR_NAMESPACES, Filesystem, Setattr
from ..errors import FsError
from ..namespace.inodes import ROOT
from ..namespace.xattrblob import XATTRS_MAX
from ..progress import Progress
from . import source
from .errors import ImportFailed
from .source import SourceDir, show
from .tally import Tally

# Inodes made between two background checkpoints. Each checkpoint's change sets, and its
# META of everything since the one before, grow with it; fewer means more catalog
# transactions. (The inode table itself is in memory whatever this is, as in a mount.)
CHECKPOINT_INODES = 50_000
# Entries made between two turns of the event loop: the log writer's completions and the
# background checkpoint's parts run in those turns.
TURN_ENTRIES = 64
# Small files whose bytes wait in the write-behind before they go to the log writer as
# one batch (one pwritev per contiguous run, not one per file).
BATCH_FILES = 256


class TreeBuilder:
    """Makes the source tree's inodes in a started Filesystem of an empty pack."""

    def __init__(self, fs: Filesystem, nursery: trio.Nursery, progress: Progress) -> None:
        self.fs = fs
        self.nursery = nursery
        self.progress = progress
        self.tally = Tally()
        self.started = time.monotonic()
        self._linked: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> inode, for files of several names
        self._buffered = 0  # files whose bytes wait in the write-behind
        self._turn = 0
        self._checkpoint_at = CHECKPOINT_INODES
        self._checkpointing = False

    async def build(self, root: bytes) -> Tally:
        """Copy the tree under root (a directory) into the pack's root."""
        try:
            st = os.lstat(root)
        except OSError as e:
            raise source.failed(root, e) from None
        await self._owner_and_mode(ROOT, st)
        self.tally.directories += 1
        todo = [(root, ROOT, st)]
        while todo:
            path, ino, st = todo.pop()
            todo += reversed(await self._directory(path, ino, st))
        self._write_batch()
        return self.tally

    async def _directory(self, path: bytes, ino: int, st: os.stat_result) -> list[tuple[bytes, int, os.stat_result]]:
        """Make a directory's entries and set its xattrs and times; its subdirectories, to walk."""
        d = SourceDir(path)
        subdirs = []
        try:
            self._xattrs(ino, source.xattrs(d.fd, path), path)
            setgid = bool(st.st_mode & stat.S_ISGID)
            for name, est in d.entries():
                made = await self._entry(d, ino, setgid, name, est)
                if made is not None:
                    subdirs.append((path + b"/" + name, made, est))
                await self._turned()
        finally:
            d.close()
        self._times(ino, st)
        return subdirs

    async def _entry(self, d: SourceDir, parent: int, setgid: bool, name: bytes, st: os.stat_result) -> int | None:
        """Make one entry in parent (setgid: which has the set-group-ID bit); a directory's
        inode (to walk), else None. The order matters: a chown takes set-ID bits, a write
        or truncate takes file capabilities (the security.capability xattr), and every
        change but the last sets ctime."""
        mode, path = st.st_mode, d.path + b"/" + name
        if stat.S_ISREG(mode) and st.st_nlink > 1:
            first = self._linked.get((st.st_dev, st.st_ino))
            if first is not None:
                with _writing(path):
                    self.fs.link(first, parent, name)
                self.tally.links += 1
                self._times(first, st)  # a link changes the file's ctime
                return None
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode) or source.is_special(mode)):
            raise ImportFailed(f"{show(path)} is of a file type packfs does not keep (mode {mode:o})")
        target = d.readlink(name) if stat.S_ISLNK(mode) else None
        with _writing(path):
            node = self.fs.create(parent, name, mode, st.st_uid, st.st_gid, st.st_rdev, target)
        if setgid:
            await self._owner_and_mode(node.ino, st)
        if stat.S_ISDIR(mode):
            self.tally.directories += 1
            return node.ino  # its xattrs and times once it is walked
        if stat.S_ISREG(mode):
            await self._file(d, node.ino, name, st, path)
            if st.st_nlink > 1:
                self._linked[(st.st_dev, st.st_ino)] = node.ino
        else:
            self._xattrs(node.ino, d.xattrs_of(name), path)
            if target is None:
                self.tally.specials += 1
            else:
                self.tally.symlinks += 1
                self.tally.target_bytes += len(target)
        self._times(node.ino, st)
        return None

    async def _file(self, d: SourceDir, ino: int, name: bytes, st: os.stat_result, path: bytes) -> None:
        """A regular file's data (its runs of data; holes stay holes), size and xattrs."""
        fd = d.open(name)
        try:
            fh = self.fs.created_handle(ino, privileged=True)  # keeps set-ID bits; no release to send
            end = 0
            for offset, data in source.pieces(fd, st, self.fs.options.disk_chunk_size, path):
                with _writing(path):
                    await self.fs.write(fh, offset, data)
                end = offset + len(data)
                self.tally.data_bytes += len(data)
            if end < st.st_size:  # a hole at the end
                with _writing(path):
                    await self.fs.setattr(ino, Setattr(size=st.st_size))
            self._xattrs(ino, source.xattrs(fd, path), path)  # after the data: a write takes capabilities
        finally:
            os.close(fd)
        self.tally.files += 1
        self.tally.bytes += st.st_size
        self._buffered += 1
        if self._buffered >= BATCH_FILES:
            self._write_batch()

    def _write_batch(self) -> None:
        """Hand every buffered file's bytes to the log writer as one batch."""
        with self.fs.volumes.batch():
            self.fs.wb.flush_all()
        self._buffered = 0

    def _xattrs(self, ino: int, pairs: list[tuple[bytes, bytes]], path: bytes) -> None:
        """Set an inode's xattrs at once, in the order of their names: Swift's metadata, then
        its continuations, then its checksum, as Swift writes them (the order the inode
        table's compact form of Swift's metadata needs; a listing gives them in any order)."""
        if not pairs:
            return
        pairs.sort()
        try:
            self.fs.setxattrs(ino, pairs)
        except FsError as e:
            bad = [name for name, _ in pairs if not name.startswith(XATTR_NAMESPACES)]
            if e.errno == errno.EOPNOTSUPP and bad:
                raise ImportFailed(f"{show(path)} has the xattr {show(bad[0])}, which packfs cannot keep (it keeps "
                                   "user., trusted. and security. xattrs; system. holds ACLs)") from None
            raise ImportFailed(f"cannot keep the xattrs of {show(path)}: {os.strerror(e.errno)} (packfs keeps "
                               f"{XATTRS_MAX:,} bytes of them per inode)") from None
        self.tally.with_xattrs += 1

    async def _owner_and_mode(self, ino: int, st: os.stat_result) -> None:
        """Where create gave other values (a set-group-ID directory's children take its
        group, its subdirectories its bit): the source's. A chown takes a file's set-ID
        bits, so the mode goes after it."""
        node = self.fs.getattr(ino)
        if node.uid != st.st_uid or node.gid != st.st_gid:
            await self.fs.setattr(ino, Setattr(uid=st.st_uid, gid=st.st_gid))
        if node.mode != st.st_mode:
            await self.fs.setattr(ino, Setattr(mode=st.st_mode))

    def _times(self, ino: int, st: os.stat_result) -> None:
        """The source's times, set last (every change before sets ctime)."""
        node = self.fs.getattr(ino)
        node.set_times(st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns)
        self.fs.ns.touch(node)

    async def _turned(self) -> None:
        """Every TURN_ENTRIES entries: a progress line if one is due, a background
        checkpoint once CHECKPOINT_INODES more inodes were made, and a turn of the loop."""
        self._turn += 1
        if self._turn < TURN_ENTRIES:
            return
        self._turn = 0
        self.fs.ns.take_journal_changes()  # to the next checkpoint, unjournaled (see above)
        self.progress(self.status)
        if self.tally.inodes >= self._checkpoint_at and not self._checkpointing:
            self._checkpoint_at = self.tally.inodes + CHECKPOINT_INODES
            self.nursery.start_soon(self._checkpoint)
        await trio.lowlevel.checkpoint()

    def status(self) -> str:
        return self.tally.line(time.monotonic() - self.started)

    async def _checkpoint(self) -> None:
        self._checkpointing = True
        try:
            await self.fs.journal.checkpoint()
        finally:
            self._checkpointing = False


@contextlib.contextmanager
def _writing(path: bytes) -> Iterator[None]:
    """The pack's refusal of what path gave it (its disk full, a broken log) as one line."""
    try:
        yield
    except FsError as e:
        if e.errno == errno.ENOSPC:
            raise ImportFailed(f"PACKDIR's filesystem is full (at {show(path)})") from None
        raise ImportFailed(f"cannot write {show(path)} into the pack: {os.strerror(e.errno)}") from None
