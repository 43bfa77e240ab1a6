"""Building a pack's tree from the source, through the core facade (Filesystem).

The reader process walks the tree (walk.py, reader.py) one directory at a time, depth
first, and this makes each item it sends as it comes. A directory's entries are all
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

import errno
import os
import stat
import time

import trio

from ..core.filesystem import XATTR_NAMESPACES, Filesystem, Setattr
from ..errors import FsError
from ..namespace.inodes import ROOT
from ..namespace.xattrblob import XATTRS_MAX
from ..progress import Progress
from .errors import ImportFailed
from .reader import Reader
from .source import show
from .tally import Tally
from .walk import DIR, END, FILE_END, LINK, NODE, PIECE, Item

_Dir = tuple[int, bytes, int, int, int, int]  # a directory's inode, path, mode, atime, mtime, ctime

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
    """Makes the source tree's inodes in a started Filesystem of an empty pack, from the
    items the reader process sends (walk.py)."""

    def __init__(self, fs: Filesystem, nursery: trio.Nursery, progress: Progress) -> None:
        self.fs = fs
        self.nursery = nursery
        self.progress = progress
        self.tally = Tally()
        self.started = time.monotonic()
        self._linked: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> inode, for files of several names
        # Directories made and not walked yet, by their number in the walk: (inode, path,
        # mode, atime, mtime, ctime), and the one being walked.
        self._dirs: dict[int, _Dir] = {}
        self._numbered = 0
        self._dir: _Dir = (ROOT, b"", 0, 0, 0, 0)
        # The file being written: (inode, path, handle, its NODE item).
        self._writing: tuple[int, bytes, int, Item] | None = None
        self._end_of_data = 0  # of the file being written: where its last piece ended
        self._buffered = 0  # files whose bytes wait in the write-behind
        self._turn = 0
        self._checkpoint_at = CHECKPOINT_INODES
        self._checkpointing: trio.Event | None = None  # set when the running background checkpoint ends

    async def build(self, root: bytes, reader: Reader) -> Tally:
        """Copy the tree under root (a directory), as the reader walks it, into the pack's root."""
        async for batch in reader.batches():
            for item in batch:
                kind = item[0]
                if kind == NODE:
                    await self._node(item)
                elif kind == DIR:
                    self._begin(item)
                elif kind == END:
                    ino, _, _, atime, mtime, ctime = self._dir
                    self._times(ino, atime, mtime, ctime)
                elif kind == PIECE:
                    await self._piece(item[1], item[2])
                elif kind == FILE_END:
                    await self._file_end()
                elif kind == LINK:
                    self._link(item)
                else:  # START
                    _, mode, uid, gid, atime, mtime, ctime = item
                    await self._owner_and_mode(ROOT, mode, uid, gid)
                    self._dirs[0] = (ROOT, root, mode, atime, mtime, ctime)
                    self.tally.directories += 1
                await self._turned()
        self._write_batch()
        return self.tally

    def _begin(self, item: Item) -> None:
        """A directory's entries come next: set its xattrs first, as it is listed."""
        _, number, xattrs = item
        self._dir = self._dirs.pop(number)
        self._xattrs(self._dir[0], xattrs, self._dir[1])

    async def _node(self, item: Item) -> None:
        """Make one entry in the directory being walked. The order matters: a chown takes
        set-ID bits, a write or truncate takes file capabilities (the security.capability
        xattr), and every change but the last sets ctime."""
        _, name, mode, uid, gid, rdev, size, atime, mtime, ctime, xattrs, content, key = item
        parent, dir_path, dir_mode = self._dir[:3]
        path = dir_path + b"/" + name
        try:
            node = self.fs.create(parent, name, mode, uid, gid, rdev, content if stat.S_ISLNK(mode) else None)
            if dir_mode & stat.S_ISGID:
                await self._owner_and_mode(node.ino, mode, uid, gid)
        except FsError as e:
            raise _refused(path, e) from None
        if stat.S_ISDIR(mode):
            self._numbered += 1
            self._dirs[self._numbered] = (node.ino, path, mode, atime, mtime, ctime)
            self.tally.directories += 1
            return  # its xattrs and times once it is walked
        if stat.S_ISREG(mode):
            if key is not None:
                self._linked[key] = node.ino
            await self._file(node.ino, path, item)
            return
        self._xattrs(node.ino, xattrs, path)
        if stat.S_ISLNK(mode):
            self.tally.symlinks += 1
            self.tally.target_bytes += len(content)
        else:
            self.tally.specials += 1
        self._times(node.ino, atime, mtime, ctime)

    async def _file(self, ino: int, path: bytes, item: Item) -> None:
        """A regular file's data (its runs of data; holes stay holes), then, unless it is
        large and its pieces follow, its size, xattrs and times."""
        fh = self.fs.created_handle(ino, privileged=True)  # keeps set-ID bits; no release to send
        self._writing = (ino, path, fh, item)
        self._end_of_data = 0
        content = item[11]
        if content is None:
            return
        for offset, data in content:
            await self._piece(offset, data)
        await self._file_end()

    async def _piece(self, offset: int, data: bytes) -> None:
        assert self._writing is not None
        _, path, fh, _ = self._writing
        try:
            await self.fs.write(fh, offset, data)
        except FsError as e:
            raise _refused(path, e) from None
        self.tally.data_bytes += len(data)
        self._end_of_data = offset + len(data)

    async def _file_end(self) -> None:
        assert self._writing is not None
        ino, path, _, item = self._writing
        self._writing = None
        size, atime, mtime, ctime, xattrs = item[6], item[7], item[8], item[9], item[10]
        if self._end_of_data < size:  # a hole at the end
            try:
                await self.fs.setattr(ino, Setattr(size=size))
            except FsError as e:
                raise _refused(path, e) from None
        self._xattrs(ino, xattrs, path)  # after the data: a write takes capabilities
        self._times(ino, atime, mtime, ctime)
        self.tally.files += 1
        self.tally.bytes += size
        self._buffered += 1
        if self._buffered >= BATCH_FILES:
            self._write_batch()

    def _link(self, item: Item) -> None:
        """Another name of a file made before; a link changes the file's ctime."""
        _, name, key, atime, mtime, ctime = item
        first = self._linked[key]
        try:
            self.fs.link(first, self._dir[0], name)
        except FsError as e:
            raise _refused(self._dir[1] + b"/" + name, e) from None
        self.tally.links += 1
        self._times(first, atime, mtime, ctime)

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

    async def _owner_and_mode(self, ino: int, mode: int, uid: int, gid: int) -> None:
        """Where create gave other values (a set-group-ID directory's children take its
        group, its subdirectories its bit): the source's. A chown takes a file's set-ID
        bits, so the mode goes after it."""
        node = self.fs.getattr(ino)
        if node.uid != uid or node.gid != gid:
            await self.fs.setattr(ino, Setattr(uid=uid, gid=gid))
        if node.mode != mode:
            await self.fs.setattr(ino, Setattr(mode=mode))

    def _times(self, ino: int, atime: int, mtime: int, ctime: int) -> None:
        """The source's times, set last (every change before sets ctime)."""
        node = self.fs.getattr(ino)
        node.set_times(atime, mtime, ctime)
        self.fs.ns.touch(node)

    async def _turned(self) -> None:
        """Every TURN_ENTRIES entries: a progress line if one is due, a background
        checkpoint once CHECKPOINT_INODES more inodes were made, and a turn of the loop.
        A builder faster than the checkpoints waits for the running one once another
        CHECKPOINT_INODES are due beside it: each checkpoint takes all that changed since
        the one before, and its snapshot's rows grow with that (memory and time both)."""
        self._turn += 1
        if self._turn < TURN_ENTRIES:
            return
        self._turn = 0
        self.fs.ns.take_journal_changes()  # to the next checkpoint, unjournaled (see above)
        self.progress(self.status)
        if self.tally.inodes >= self._checkpoint_at:
            if self._checkpointing is not None and self.tally.inodes >= self._checkpoint_at + CHECKPOINT_INODES:
                await self._checkpointing.wait()
            if self._checkpointing is None:
                self._checkpoint_at = self.tally.inodes + CHECKPOINT_INODES
                self._checkpointing = trio.Event()
                self.nursery.start_soon(self._checkpoint, self._checkpointing)
        await trio.lowlevel.checkpoint()

    def status(self) -> str:
        return self.tally.line(time.monotonic() - self.started)

    async def _checkpoint(self, done: trio.Event) -> None:
        try:
            await self.fs.journal.checkpoint()
        finally:
            self._checkpointing = None
            done.set()


def _refused(path: bytes, e: FsError) -> ImportFailed:
    """The pack's refusal of what path gave it (its disk full, a broken log) as one line."""
    if e.errno == errno.ENOSPC:
        return ImportFailed(f"PACKDIR's filesystem is full (at {show(path)})")
    return ImportFailed(f"cannot write {show(path)} into the pack: {os.strerror(e.errno)}")
