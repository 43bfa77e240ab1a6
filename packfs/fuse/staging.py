"""Staged files: written by the kernel straight to the backing filesystem (FUSE passthrough).

A Swift PUT writes its object into a file with no name (open(O_TMPFILE)) in pieces of
its network_chunk_size, 64 KiB by default: one FUSE request each, 16 of a 1 MiB PUT's
~50, and Swift's one hub thread sleeps through every one. With the `passthrough` option
the create of such a file answers with a staging file (an unnamed file in the pack
directory) as the open file's backing file (the fuse shim; FUSE_PASSTHROUGH, Linux 6.9
and later): the kernel writes and reads that open file there, as a local filesystem
would, and packfs takes the bytes into its log -- absorbs them -- whenever another
could see the file otherwise:

- at an fsync (Swift's, before it links the file), at a link, and once the file is
  closed;
- before a getattr, and before a setattr or fallocate (which the kernel still sends),
  whose changes are made to the staging file too, so the open file reads them back.

While a file is open for passthrough the kernel refuses (EIO) any other open of it but
another open for passthrough on the same backing file, which only an OPEN's reply can
ask for (so with this option files are not opened without a request: the fuse shim
answers the OPEN of any other file in C). An open for reading gets one (`share`): it
reads the staging file, which reads as the file does. For Swift, that is a GET of an
object in the ~1 ms between its PUT's linkat and the PUT's close. An open for writing
still fails: its bytes and its close could not be told from the creator's.

The kernel sends no write requests for the file, and its RELEASE (an absorb point too)
may come while a shared mapping still writes to the backing file: packfs learns of
writes and of the end from inotify on the staging file (IN_MODIFY; IN_CLOSE_WRITE once
the creator's backing file is closed, mappings and all, packfs keeping its own
descriptor until then). A staging with readers ends once they are released too, and
its staging file is then let go, not reused: a reader's mapping may still read it.

An absorb cannot know which bytes changed, so it reads the staging file through and
writes only the chunks whose digests differ from what it took last time: a file written
once, front to back, is read and written once more. An fsync and the close read it
through whatever (a shared mapping's stores change neither its size nor, after the
first, its mtime); the other points only when the file's size or mtime moved or the
kernel said it was written, and otherwise return without a turn of the event loop. While
a large file is written, whole chunks past what was taken are absorbed in the
background, so the log's writes overlap the upload instead of following it. Staging
files the kernel has closed are truncated and kept for the next creates (POOL_MAX), with
their watches: a file with no name costs the backing filesystem a journaled allocation
and a release each.

What an absorb has not taken yet is what the write-behind has not flushed: a crash may
lose it, an fsync never does. A staging file costs its bytes on the backing filesystem
(in its page cache while it is written) until its file is closed.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Protocol

import trio
from zlib_ng.zlib_ng import adler32, crc32

from ..core.filesystem import FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE
from ..store.disk import Disk
from .inotify import IN_CLOSE_WRITE, IN_MODIFY, IN_Q_OVERFLOW, Inotify

log = logging.getLogger(__name__)

CHUNKS_AHEAD = 4  # whole chunks past what was taken before a background absorb starts
POOL_MAX = 32  # empty staging files kept for the next creates, with their watches
_WATCHED = IN_MODIFY | IN_CLOSE_WRITE  # (a reader's close is IN_CLOSE_NOWRITE: not the end)


class Kernel(Protocol):
    """What staging asks of the FUSE session (the fuse shim's functions in the daemon)."""

    def passthrough(self) -> bool: ...
    def stage(self, fh: int, ino: int, fd: int) -> bool: ...
    def staged_id(self, fh: int) -> int: ...
    def unstage(self, fh: int) -> None: ...
    def share(self, ino: int, fh: int) -> bool: ...
    def unshare(self, fh: int) -> None: ...


class Store(Protocol):
    """Where absorbed bytes go: the filesystem, through a handle staging holds on the file
    (which also keeps its inode number from being reused while it is staged)."""

    def open(self, ino: int, truncate: bool = False, privileged: bool = True) -> int: ...
    async def write(self, fh: int, offset: int, data: bytes) -> int: ...
    async def release(self, fh: int) -> None: ...


Digest = tuple[int, int, int]  # a chunk's length, CRC-32 and Adler-32 as last taken


def _digest(data: bytes) -> Digest:
    return len(data), crc32(data), adler32(data)


@contextlib.asynccontextmanager
async def _held(lock: trio.Lock) -> AsyncIterator[None]:
    """The lock, taken without a turn of the event loop when it is free."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    try:
        yield
    finally:
        lock.release()


@dataclass(eq=False)
class Staged:
    """One file whose open is backed by a staging file."""

    ino: int
    fh: int  # the handle the kernel was given (the fuse shim knows the staging by it)
    hold: int  # staging's own handle on the file, which absorbs write through
    fd: int
    wd: int
    digests: list[Digest] = field(default_factory=list)  # per chunk, as last taken
    seen: tuple[int, int] = (0, 0)  # the staging file's size and mtime at the last absorb
    written: bool = False  # the kernel said so (IN_MODIFY) since the last absorb
    readers: set[int] = field(default_factory=set)  # handles of the opens it shares its backing file with
    shared: bool = False  # it ever did: its staging file is not reused
    closed: bool = False  # the creator's backing file is closed (the end, once no reader is left)
    ended: bool = False  # its staging file is given back
    lock: trio.Lock = field(default_factory=trio.Lock)

    def whole_chunks_taken(self, chunk: int) -> int:
        n = 0
        for length, _crc, _adler in self.digests:
            if length < chunk:
                break
            n += 1
        return n


class Staging:
    """The staged files of one mount and the inotify watch that follows them."""

    def __init__(self, store: Store, disk: Disk, directory: str, chunk: int, kernel: Kernel) -> None:
        self.store = store
        self.disk = disk
        self.directory = directory
        self.chunk = chunk
        self.kernel = kernel
        self._notify = Inotify()
        self._by_ino: dict[int, Staged] = {}
        self._by_wd: dict[int, Staged] = {}
        self._by_reader: dict[int, Staged] = {}
        self._pool: list[tuple[int, int]] = []  # (descriptor, watch) of empty staging files
        self._nursery: trio.Nursery | None = None
        self.staged = 0  # files staged since the mount
        self.absorbed_bytes = 0  # bytes written into the store by absorbs
        self.refused = 0  # creates the kernel or the backing filesystem would not stage
        self.shared = 0  # opens given a staged file's backing file

    def __len__(self) -> int:
        return len(self._by_ino)

    def __contains__(self, ino: int) -> bool:
        return ino in self._by_ino

    def begin(self, ino: int, fh: int, privileged: bool) -> None:
        """Stage the file a create is about to answer with handle `fh`, if it can be
        (privileged: its creator may keep set-ID bits)."""
        if not self.kernel.passthrough():
            return  # the kernel did not take FUSE_PASSTHROUGH
        staging = self._pool.pop() if self._pool else self._new_staging_file()
        if staging is None:
            return
        fd, wd = staging
        if not self.kernel.stage(fh, ino, fd):
            self.refused += 1
            self._recycle(fd, wd)
            return
        s = Staged(ino, fh, self.store.open(ino, privileged=privileged), fd, wd)
        self._by_ino[ino] = s
        self._by_wd[wd] = s
        self.staged += 1

    def open_for_passthrough(self, ino: int) -> bool:
        """Whether the kernel may hold the file `ino` open for passthrough: its creator's
        open, or a reader's after the creator's close."""
        s = self._by_ino.get(ino)
        return s is not None and self.kernel.staged_id(s.fh) > 0

    def share(self, ino: int, fh: int) -> bool:
        """An open of the staged file `ino` answers with handle `fh`: give it the staging
        file as its backing file too. False if the kernel cannot (see Kernel.share)."""
        s = self._by_ino.get(ino)
        if s is None or not self.kernel.share(ino, fh):
            return False
        s.readers.add(fh)
        s.shared = True
        self._by_reader[fh] = s
        self.shared += 1
        return True

    async def unshare(self, fh: int) -> None:
        """The handle `fh` is released: if a staged file's backing file was shared with it,
        that staging ends when the creator's is closed and no reader is left."""
        s = self._by_reader.pop(fh, None)
        if s is None:
            return
        self.kernel.unshare(fh)
        s.readers.discard(fh)
        if s.closed and not s.readers:
            await self._give_back(s, absorb=True)

    async def absorb(self, ino: int, verify: bool = False) -> None:
        """Take what the kernel wrote to the file's staging file into the store (a no-op
        for a file not staged). verify: read it through even if nothing says it changed."""
        s = self._by_ino.get(ino)
        if s is None:
            return
        self._take_events()
        if self.kernel.staged_id(s.fh) < 0:  # the kernel opened it without: writes come as requests
            self.refused += 1
            await self._give_back(s, absorb=False)
        elif verify or self._changed(s):
            async with _held(s.lock):
                if not s.ended:
                    await self._absorb_locked(s, verify)

    async def mirror_truncate(self, ino: int, size: int) -> None:
        """The store's file was truncated (after `absorb`): the staging file must read the same."""
        s = self._by_ino.get(ino)
        if s is not None:
            async with _held(s.lock):
                if not s.ended:
                    self.disk.truncate(s.fd, size)
                    self._forget_digests(s, size)

    async def mirror_fallocate(self, ino: int, mode: int, offset: int, length: int, size: int) -> None:
        """A fallocate the store served (its file now `size` long): a range punched or
        zeroed reads as zeros in the staging file too, and a file grown is as long there.
        A reservation alone (Swift's, before each object) changes nothing anyone reads."""
        s = self._by_ino.get(ino)
        punched = bool(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
        if s is None or not punched and self.disk.size(s.fd) >= size:
            return
        async with _held(s.lock):
            if s.ended:
                return
            if punched:
                self.disk.punch_hole(s.fd, offset, length)
                self._forget_digests(s, offset)
            if self.disk.size(s.fd) < size:
                self.disk.truncate(s.fd, size)

    async def end(self, ino: int) -> None:
        """The kernel closed the creator's backing file (the FUSE file's RELEASE may come
        before, while a shared mapping of it lasts): take its last bytes, give back its
        staging file, or with readers left, keep it for them. If the store refuses the
        bytes (ENOSPC, EIO), the staging stays for the next try, at the latest the
        mount's end."""
        s = self._by_ino.get(ino)
        if s is None:
            return
        if s.readers:
            s.closed = True
            await self.absorb(ino, verify=True)
        else:
            await self._give_back(s, absorb=self.kernel.staged_id(s.fh) >= 0)

    async def close(self) -> None:
        """Absorb and end every staged file (before the mount's final checkpoint)."""
        self._take_events()
        for s in list(self._by_ino.values()):
            try:
                await self._give_back(s, absorb=True)
            except Exception:
                log.exception("passthrough: what the kernel wrote for inode %d could not be taken", s.ino)
        while self._pool:
            fd, _wd = self._pool.pop()
            self.disk.close(fd)

    async def run(self, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the staging files' writes and closes until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(self._notify.fd)
                    self._take_events()
        finally:
            self._nursery = None
            trio.lowlevel.notify_closing(self._notify.fd)
            self._notify.close()

    # -- inside ---------------------------------------------------------------------

    def _new_staging_file(self) -> tuple[int, int] | None:
        try:
            fd = self.disk.open_unnamed(self.directory)
        except OSError as e:
            self._refuse(f"no staging file in {self.directory}: {e}")
            return None
        try:
            return fd, self._notify.watch_fd(fd, _WATCHED)
        except OSError as e:
            self.disk.close(fd)
            self._refuse(f"no inotify watch on a staging file: {e}")
            return None

    def _refuse(self, why: str) -> None:
        if not self.refused:
            log.warning("passthrough: %s; files are written through requests", why)
        self.refused += 1

    def _recycle(self, fd: int, wd: int) -> None:
        """Keep an unstaged staging file, emptied, for a later create, or close it."""
        if len(self._pool) < POOL_MAX:
            try:
                self.disk.truncate(fd, 0)
            except OSError:
                pass
            else:
                self._pool.append((fd, wd))
                return
        self._notify.unwatch(wd)
        self.disk.close(fd)

    def _changed(self, s: Staged) -> bool:
        """Whether the staging file may hold bytes the last absorb did not see."""
        if s.written:
            return True
        st = os.fstat(s.fd)
        return (st.st_size, st.st_mtime_ns) != s.seen

    def _forget_digests(self, s: Staged, offset: int) -> None:
        """The staging file changed from offset on: its chunks there are taken again."""
        del s.digests[offset // self.chunk:]
        s.written = True

    async def _give_back(self, s: Staged, absorb: bool) -> None:
        async with _held(s.lock):
            if s.ended:
                return
            if absorb:
                await self._absorb_locked(s, verify=True)
            s.ended = True
            del self._by_ino[s.ino]
            del self._by_wd[s.wd]
            for fh in s.readers:  # (only at the mount's end)
                self._by_reader.pop(fh, None)
                self.kernel.unshare(fh)
            self.kernel.unstage(s.fh)
            if s.shared:  # a reader's mapping may still read it
                self._notify.unwatch(s.wd)
                self.disk.close(s.fd)
            else:
                self._recycle(s.fd, s.wd)
        await self.store.release(s.hold)

    def _take_events(self) -> None:
        for wd, mask in self._notify.read():
            if mask & IN_Q_OVERFLOW:
                # Writes and closes were lost: every staging is read through at its next
                # absorb; one whose close was lost stays until the mount ends.
                log.warning("passthrough: inotify queue overflowed")
                for s in self._by_ino.values():
                    s.written = True
                continue
            s = self._by_wd.get(wd)  # (None: a pooled file, truncated by packfs)
            if s is None:
                continue
            if mask & IN_MODIFY:
                s.written = True
                self._after_write(s)
            if mask & IN_CLOSE_WRITE:
                self._background(self.end, s.ino)

    def _background(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run fn in the watch's nursery; what fails there is logged, never the mount's end."""
        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("passthrough: %s failed", fn.__name__)

        if self._nursery is not None:
            self._nursery.start_soon(guarded)

    def _after_write(self, s: Staged) -> None:
        if not s.lock.locked():
            size = self.disk.size(s.fd)
            taken = s.whole_chunks_taken(self.chunk) * self.chunk
            if size - taken >= CHUNKS_AHEAD * self.chunk:
                self._background(self._absorb_ahead, s)

    async def _absorb_ahead(self, s: Staged) -> None:
        """Take the whole chunks past what was taken, while the file is still written."""
        async with _held(s.lock):
            if s.ended:
                return
            size = self.disk.size(s.fd)
            start = s.whole_chunks_taken(self.chunk) * self.chunk
            end = size - size % self.chunk
            if end - start >= CHUNKS_AHEAD * self.chunk:
                await self._take(s, start, end)

    async def _absorb_locked(self, s: Staged, verify: bool) -> None:
        st = os.fstat(s.fd)
        seen = (st.st_size, st.st_mtime_ns)
        if not verify and not s.written and seen == s.seen:
            return
        s.written = False
        try:
            await self._take(s, 0, st.st_size)
        except BaseException:
            s.written = True  # (the next absorb reads it through again)
            raise
        s.seen = seen

    async def _take(self, s: Staged, start: int, end: int) -> None:
        """Write the chunks of [start, end) that differ from what was taken into the store."""
        start = min(start - start % self.chunk, len(s.digests) * self.chunk)  # digests stay in order
        for offset in range(start, end, self.chunk):
            n = min(self.chunk, end - offset)
            data = self.disk.pread_cached(s.fd, n, offset)
            if data is None:
                data = await trio.to_thread.run_sync(self.disk.pread, s.fd, n, offset)
            if len(data) != n:
                raise OSError(errno.EIO, "a staging file was cut short while it was read")
            i = offset // self.chunk
            digest = _digest(data)
            if i < len(s.digests) and s.digests[i] == digest:
                continue
            await self.store.write(s.hold, offset, data)
            self.absorbed_bytes += n
            if i < len(s.digests):
                s.digests[i] = digest
            else:
                s.digests.append(digest)
