"""The volume files: one ordered log of records, appended by a single writer.

Records are reserved (given a volume and offset) synchronously on the trio loop, in the
order the core decides, and written by one log writer thread (logwriter.py), in that
order, off the loop. Every take of the writer that contains a record asking for
durability ends with one fdatasync: concurrent fsyncs therefore share one device flush
(group commit), and a flush always covers every record before it in the log.

Space is preallocated ahead of the tail in large steps, so a write into the log can
only fail with EIO, never ENOSPC: ENOSPC is raised by `ensure_space` before anything
is reserved, and the last `reserve` bytes are kept for metadata, so unlinks can always
be made durable and their space returned. An I/O error on a write or flush breaks the
log: every later write and fsync fails with EIO, as ext4 does with errors=remount-ro.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import trio

from ..errors import FsError
from ..stats import OpStats
from . import extents as ext
from . import records
from .disk import Disk
from .groupcommit import GroupCommits
from .logwriter import LogWriter, Op, writer_for

log = logging.getLogger(__name__)

PREALLOC_STEP = 4 << 20  # volumes grow by this much at a time
PREALLOC_AHEAD = 64 << 20  # the background keeps this much prepared ahead of the tail
INLINE_READ_MAX = 256 << 10  # warm records up to this size are read and checked on the loop
ZERO_FLUSH_STEP = 1 << 20  # zeros are flushed in small steps, so a commit never waits behind many
STREAM_GAP = 16 << 20  # while writers outrun the zeros, space this close ahead of the tail is fallocated
# Zeros go over fallocated space no closer to the tail than this, so that commits never
# wait for a piece of them: 256 KiB is ~20 of Swift's small PUTs, which come far slower
# than a piece is written; while commits are crowded, STREAM_GAP.
REZERO_GAP = 256 << 10
CROWDED_HOLD = 1.0  # seconds after a commit that was not alone during which the background fallocates
META_RESERVE = 4 << 20  # preallocated volume space only metadata may use
HEADROOM = 32 << 20  # backing-disk space data never takes, so the catalog can checkpoint


def volume_name(number: int) -> str:
    return f"{number:08d}.pack"


class _FlushFailed(OSError):
    """A flush of a volume failed: writes it covered, records among them, may be lost."""


@dataclass(slots=True)
class _Queued:
    ticket: int
    volume: int
    offset: int
    parts: list[records.Payload]  # the record's buffers (records.encode), back to back
    size: int
    sync: bool
    ino: int = 0  # the file of a DATA record (0 for the log's own)


def _runs(keys: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
    """(volume, offset, length) of the runs the records `keys` name, adjacent and repeated
    records merged into one. Files rewritten over and over leave their old records side
    by side: four threads doing so, ~1 GB of dead records in 20 s, made a checkpoint that
    punched them one fallocate each take 16.8-16.9 s (a `sync`, so an unmount, waited
    for it); in runs, 0.4-1.2 s."""
    run_vol, run_start, run_end = -1, 0, 0
    for vol, off, rlen in sorted(keys):
        end = off + records.footprint(rlen)
        if vol == run_vol and off <= run_end:
            run_end = max(run_end, end)
            continue
        if run_vol >= 0:
            yield run_vol, run_start, run_end - run_start
        run_vol, run_start, run_end = vol, off, end
    if run_vol >= 0:
        yield run_vol, run_start, run_end - run_start


class Volumes:
    def __init__(self, disk: Disk, directory: str, pack_id: int, volume_size: int,
                 cache_bytes: int = 64 << 20) -> None:
        self.disk = disk
        self.directory = directory
        self.pack_id = pack_id
        self.volume_size = volume_size
        self.fds: dict[int, int] = {}
        self.active = 1
        self.tail = 0
        self.allocated = 0  # bytes preallocated in the active volume
        # Spans [start, end) of the active volume that were fallocated and not written
        # (unwritten extents), in order: the background writes zeros there (_rezero).
        self.unwritten: list[list[int]] = []
        self.seq = 1
        self.broken = 0  # errno that broke the log, or 0
        self.appended = 0  # bytes appended since this mount
        self.queued_bytes = 0  # bytes reserved and not yet written
        self.reserved = 0  # space promised to buffered writes (writeback.WriteBehind)
        self.durable_pos = (0, 0)  # (volume, offset): the log before it is flushed
        self.writes = 0  # pwrite calls
        self.flushes = 0  # fdatasync batches
        self.flushes_on_loop = 0  # of them, written and flushed by the event loop (write_now)
        self.punched_bytes = 0
        self.prefetches = 0  # records whose read was started ahead (prefetch)
        self.reads_waited = 0  # records read by a worker thread: the page cache lacked them
        self.timings = OpStats()  # device-level write and flush latency
        self.group = GroupCommits()
        # Records reserved and not yet submitted to the log writer (see run): those of a
        # batch() in progress, or all of them until run starts the writer.
        self._pending: list[_Queued] = []
        self._writer: LogWriter | None = None
        # Submitted to the writer, by tag: the records, and the volume planned before them.
        self._batches: dict[int, tuple[list[_Queued], int]] = {}
        self._next_tag = 1
        self._outstanding = 0  # records submitted to the writer, not yet done
        self._syncs_in_hand = 0  # of the batches submitted, those that end in a flush
        self._planned_volume = 0  # the volume of the last record submitted
        self._batching = 0  # inside batch(): the writer gets the records when it ends
        self._inflight: dict[tuple[int, int], list[records.Payload]] = {}  # records not yet written
        self._next_ticket = 1
        self._written = 0
        self._synced = 0
        self._progress = trio.Event()
        self._last_meta_end: dict[int, int] = {}
        self._cache: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_max = cache_bytes
        self._loading: dict[tuple[int, int], trio.Event] = {}
        self._grow_lock = trio.Lock()
        self._grow_wanted = trio.Event()
        self._space_waiters = 0  # writers waiting for the grow lock: zero-filling stops for them
        self._outrun = False  # a writer waited for zeros: fallocate until STREAM_GAP ahead again
        self._crowded_until = 0.0  # the background fallocates until then (see note_commit)
        # Zero-filling runs in a worker thread while records are reserved on the loop; a
        # record reserved past the prepared space sets the fence, and no zeros land at
        # or beyond it (see append and _grow).
        self._zero_lock = threading.Lock()
        self._fence = 1 << 62
        # Where zeros are being written over fallocated space ahead of the tail (_rezero):
        # a record reserved past it waits for the piece (append).
        self._zeroing = 1 << 62

    # -- opening --------------------------------------------------------------

    def path(self, number: int) -> str:
        return os.path.join(self.directory, volume_name(number))

    def existing(self) -> list[int]:
        return sorted(int(n[:-5]) for n in self.disk.listdir(self.directory)
                      if n.endswith(".pack") and n[:-5].isdigit())

    def fd(self, number: int) -> int:
        fd = self.fds.get(number)
        if fd is None:
            fd = self.fds[number] = self.disk.open(self.path(number), create=False)
        return fd

    def open_tail(self, active: int, tail: int, seq: int) -> None:
        """Continue the log at (active, tail); called once recovery found the end."""
        self.active, self.tail, self.seq = active, tail, seq
        self._last_meta_end = {active: tail}
        self.durable_pos = (active, tail)
        if active not in self.existing():
            self._create(active)
        self.allocated = max(tail, self.disk.size(self.fd(active)))
        self.unwritten = [list(span) for span in self.disk.holes(self.fd(active), tail, self.allocated)]

    def _create(self, number: int) -> None:
        fd = self.disk.open(self.path(number), create=True)
        self.fds[number] = fd
        self.disk.fsync_dir(self.directory)

    def close(self) -> None:
        for fd in self.fds.values():
            self.disk.close(fd)
        self.fds.clear()

    # -- space ------------------------------------------------------------------

    @property
    def _limit(self) -> int:
        """How far the active volume is ever prepared: its size and the metadata reserve."""
        return self.volume_size + META_RESERVE

    def has_room(self, nbytes: int) -> bool:
        """True if nbytes of data can be appended now without growing the volume."""
        return not self.broken and self.tail + self.reserved + nbytes + META_RESERVE <= self.allocated

    def could_take(self, nbytes: int) -> bool:
        """Whether nbytes more of data would find disk space now (fallocate's answer: the
        log places data as it comes, so nothing can be held for one file)."""
        if self.has_room(nbytes):
            return True
        st = self.disk.statvfs(self.directory)
        growable = max(0, st.f_bavail * st.f_frsize - HEADROOM)
        return self.has_room(nbytes - growable)  # room once the volume grows into the free space

    def refuse_if_broken(self) -> None:
        """EIO once an I/O error has broken the log: nothing more can be committed."""
        if self.broken:
            raise FsError(errno.EIO, "the volume log is broken by an earlier I/O error")

    async def ensure_space(self, nbytes: int, metadata: bool = False) -> None:
        """Make sure the next nbytes of appends have disk space, or raise ENOSPC."""
        self.refuse_if_broken()
        keep = 0 if metadata else META_RESERVE
        if self.tail + self.reserved + nbytes + keep <= self.allocated:
            return
        async with self._grow_lock_for_writer():
            try:
                if self.tail + nbytes > self.volume_size and self.tail > 0:
                    await self._roll_over()
                need = self.tail + self.reserved + nbytes + keep
                if need <= self.allocated:
                    return
                preferred = max(need, min(self.allocated + PREALLOC_STEP, self._limit))
                await self._grow_to(need, preferred, metadata, zeros=False)
            except OSError as e:
                raise self._grow_failed(e) from e
            self._grow_wanted.set()  # and the rest in the background

    def _grow_failed(self, e: OSError) -> FsError:
        """What a writer hears when the log cannot grow or roll over. A backing disk that
        fails (EIO) or has gone read-only (EROFS: ext4 aborts itself on metadata errors)
        breaks the log as a failed write would, so this change and every later one fail
        with EIO; ENOSPC and other refusals leave the log as it is."""
        err = e.errno or errno.EIO
        if err in (errno.EIO, errno.EROFS):
            self._break(err)
            return FsError(errno.EIO, f"cannot grow the active volume: {e}")
        return FsError(err, "cannot grow the active volume")

    @contextlib.asynccontextmanager
    async def _grow_lock_for_writer(self):
        """The grow lock, for a writer in need: the background stops zero-filling for it
        between two pieces, so the writer waits for one piece, not a whole step (measured:
        a 64 KiB stream's writes stalled ~15 ms every 4 MiB behind a step of zeros)."""
        self._space_waiters += 1
        try:
            await self._grow_lock.acquire()
        finally:
            self._space_waiters -= 1
        try:
            yield
        finally:
            self._grow_lock.release()

    async def _grow_to(self, need: int, preferred: int, metadata: bool, zeros: bool = True) -> None:
        """Prepare the active volume towards preferred (the caller holds the grow lock)."""
        if self.broken:  # perhaps while this caller waited for the lock
            raise OSError(self.broken, "the volume log is broken by an earlier I/O error")
        self._fence = 1 << 62
        try:
            prepared = await trio.to_thread.run_sync(self._grow, self.fd(self.active), need, preferred, metadata,
                                                     zeros)
        except _FlushFailed as e:
            # Linux reports a writeback error to one fdatasync only: this one may have
            # taken the report of a record's lost write, so the log breaks as the
            # log writer's would.
            self._break(e.errno or errno.EIO)
            raise
        self.allocated = max(self.allocated, prepared)

    def _grow(self, fd: int, need: int, preferred: int, metadata: bool, zeros: bool) -> int:
        """Preallocate towards preferred, at least to need; data leaves HEADROOM for the catalog.

        In the background zeros are written and flushed step by step: appends into
        written, flushed blocks let a commit's fdatasync flush data alone (no extent
        conversion, no size change), and no commit ever has to flush a large run of
        fresh zeros. A writer that outran them (a stream) gets its step fallocated
        instead (zeros=False): it waits for neither the zeros nor their flush, and the
        commit that ends the stream flushes the size and extents with its data. Data
        written there is written once, not after zeros (measured: +10-20% for a
        512 MiB stream in 64 KiB and 1 MiB writes).

        The zeros stop between two pieces for a writer that waits for the grow lock, and
        once one waited, the background fallocates as well until it is STREAM_GAP ahead
        of the tail again: while writers outrun the zeros, zeros only double the disk's
        work and make the writers wait (measured on a slow-flush day: a 64 KiB stream's
        writes stalled ~15 ms every 4 MiB, 168 MiB/s; 318-399 MiB/s without the stalls).
        """
        st = self.disk.statvfs(self.directory)
        free = st.f_bavail * st.f_frsize
        target = min(preferred, self.allocated + max(0, free - HEADROOM))
        if target < need and metadata and need - self.allocated <= free:
            target = need  # metadata may dip into the headroom, by no more than it needs
        if target < need:
            raise OSError(errno.ENOSPC, "the backing disk is full")
        pos = self.allocated
        if not zeros or (self._outrun and pos - self.tail < STREAM_GAP):
            self.disk.allocate(fd, pos, target - pos, zeros=False)  # blocks written meanwhile stay as written
            if self.unwritten and self.unwritten[-1][1] == pos:
                self.unwritten[-1][1] = target
            else:
                self.unwritten.append([pos, target])
            return target
        self._outrun = False  # the writers fell STREAM_GAP behind (or never outran): zeros
        while pos < target:
            if self._space_waiters:
                self._outrun = True  # a writer caught up with the zeros and waits for them
                break  # it fallocates its own step
            n = min(ZERO_FLUSH_STEP, target - pos)
            with self._zero_lock:
                if pos + n > self._fence:
                    break  # a record was reserved here meanwhile: it extends the volume itself
                self.disk.allocate(fd, pos, n)
            try:
                self.disk.fdatasync(fd)
            except OSError as e:
                raise _FlushFailed(e.errno or errno.EIO, f"flushing the volume failed: {e}") from e
            pos += n
        return pos

    def _rezero(self, fd: int, gap: int) -> None:
        """Write zeros over one piece of fallocated space ahead of the tail, and flush.

        Space fallocated while commits were crowded (note_commit) or for a writer that
        outran the zeros stays unwritten, and every lone commit that later lands in it
        costs the backing filesystem an extent conversion, so its fdatasync also writes
        XFS's log: on a hard disk a second access (measured with Swift's single-threaded
        PUTs on a fresh pack: 0.47 log writes a PUT besides its one data write; while
        concurrent commits share flushes, one a flush). So the background turns that space
        into written zeros too, `gap` ahead of the tail: a write within the file's size
        holds the inode shared, unlike the extending zeros that made crowded commits
        wait, and it converts 1 MiB a log write where commits convert a few KiB each.
        """
        while self.unwritten and self.unwritten[0][1] <= self.tail + REZERO_GAP:
            self.unwritten.pop(0)  # the tail is about to reach it (only threads under the grow lock edit the list)
        i = next((i for i, (_, e) in enumerate(self.unwritten) if e > self.tail + gap), None)
        if i is None:
            return
        start, end = self.unwritten[i]
        with self._zero_lock:
            pos = max(start, self.tail + gap)
            self._zeroing = pos  # from here on a record reserved past pos waits for the lock
            try:
                # Read the tail again only now: a record reserved before _zeroing was set
                # did not wait, and may reach past pos (append sets the tail, then reads
                # _zeroing; this sets _zeroing, then reads the tail: one sees the other).
                if pos < self.tail + gap or pos >= end:
                    return  # records got close meanwhile
                n = min(ZERO_FLUSH_STEP - pos % ZERO_FLUSH_STEP, end - pos)
                self.disk.allocate(fd, pos, n)
            finally:
                self._zeroing = 1 << 62
        try:
            self.disk.fdatasync(fd)
        except OSError as e:
            raise _FlushFailed(e.errno or errno.EIO, f"flushing the volume failed: {e}") from e
        # what is left of the span: before the piece (too close to the tail then), after it
        self.unwritten[i:i + 1] = [[a, b] for a, b in ((start, pos), (pos + n, end)) if a < b]

    def _rezero_wanted(self, gap: int = REZERO_GAP) -> bool:
        """Fallocated space lies at least `gap` ahead of the tail."""
        return bool(self.unwritten) and self.unwritten[-1][1] > self.tail + max(gap, REZERO_GAP)

    async def run_preallocator(self) -> None:
        """Background: keep PREALLOC_AHEAD of prepared space ahead of the tail.

        Appends then rarely wait for a grow, and the zero-filling competes with them only
        as background I/O, and not at all while commits are crowded (note_commit). Never
        rolls over (that is the writers' decision) and never raises: a writer that finds
        no room grows or hears ENOSPC itself.
        """
        while True:
            rezero_at = self._crowded_until if self._rezero_wanted() and not self.broken else math.inf
            with trio.move_on_at(rezero_at):  # once the crowd is gone, its fallocated space gets zeros
                await self._grow_wanted.wait()
            self._grow_wanted = trio.Event()
            while True:
                async with self._grow_lock:  # one step per hold (a writer in need waits for one piece)
                    if self.broken:
                        break
                    zeros = trio.current_time() >= self._crowded_until
                    gap = REZERO_GAP if zeros else STREAM_GAP
                    try:
                        if self._room() < PREALLOC_AHEAD and self.allocated < self._limit:
                            await self._grow_to(self.allocated + records.BLOCK,
                                                min(self.allocated + PREALLOC_STEP, self._limit), False, zeros)
                        elif not self._outrun and not self._space_waiters and self._rezero_wanted(gap):
                            await self._zero_a_piece(gap)
                        else:
                            break
                    except OSError as e:
                        log.debug("background preallocation stopped: %s", e)
                        self.unwritten.clear()  # not tried again for this space
                        break

    async def _zero_a_piece(self, gap: int) -> None:
        """One piece of _rezero, in a thread (the caller holds the grow lock)."""
        try:
            await trio.to_thread.run_sync(self._rezero, self.fd(self.active), gap)
        except _FlushFailed as e:
            self._break(e.errno or errno.EIO)  # as in _grow_to: the flush may have taken a record's error
            raise

    def note_commit(self, alone: bool) -> None:
        """An fsync's commit is on its way; alone: no other request was in flight.

        Zeros ahead of the tail pay where fsyncs come one at a time: each flush is then
        data alone, no extent conversion. Where several writers share the flushes, the
        zeros' writes contend with theirs (an extending direct write holds the volume's
        inode), and fallocating is worth more: fio's small files with 4 jobs on an XFS
        loop device, a fresh pack per run, medians of five A/B runs of 3-4 alternated
        rounds: 1,305-1,655 files/s fallocating against 895-1,065 with zeros (fsync p99
        5.7-8.4 against 15.6-23.2 ms), where 1 job ran 459-583 against 640-824. So the
        background fallocates for CROWDED_HOLD after a commit that was not alone, and
        writes zeros otherwise."""
        if not alone:
            self._crowded_until = trio.current_time() + CROWDED_HOLD
        elif self.unwritten and trio.current_time() >= self._crowded_until:
            self._grow_wanted.set()  # fallocated space ahead: the background writes its zeros

    @property
    def preallocator_idle(self) -> bool:
        """True when the background preallocator has nothing left to prepare (nor is asked to)."""
        full = self._room() >= PREALLOC_AHEAD or self.allocated >= self._limit
        return self.broken or (full and not self._rezero_wanted() and not self._grow_wanted.is_set())

    def _room(self) -> int:
        """Prepared bytes past the tail that no buffered write has claimed."""
        return self.allocated - self.tail - self.reserved

    async def _roll_over(self) -> None:
        number = self.active + 1
        await trio.to_thread.run_sync(self._create, number)
        # No await from here to the switch: a record reserved meanwhile must not land
        # past the end we cut the old volume at.
        old, end = self.active, self.tail
        self.active, self.tail, self.allocated = number, 0, 0
        self.unwritten.clear()
        # The old volume ends at its last record: give back what was preallocated past it.
        await trio.to_thread.run_sync(self.disk.truncate, self.fd(old), end)
        log.info("rolled over to volume %s", volume_name(number))

    # -- appending ----------------------------------------------------------------

    def append(self, rtype: int, ino: int, offset: int, *payload: records.Payload,
               sync: bool = False, trailer: bytes = b"") -> tuple[int, int, int]:
        """Reserve the next log position for a record of the payload's parts, in order, and
        queue it; returns (volume, offset, ticket). trailer: the file's xattrs, for the
        padding of a DATA record (records.trailer_fits).

        Synchronous: the log order is the order of calls. A META record's `offset` field
        holds where its write batch began (see recovery), filled in here.
        """
        self.refuse_if_broken()
        vol, off = self.active, self.tail
        if rtype == records.META:
            offset = self._last_meta_end.get(vol, 0)
        parts = records.encode(rtype, self.seq, ino, offset, payload, self.pack_id, trailer)
        size = sum(map(len, parts))
        self.seq += 1
        self.tail += size
        if self.tail > self._zeroing:
            with self._zero_lock:
                pass  # zeros are being written where this record lands: they go first
        if self.tail > self.allocated:
            # A commit bigger than the space prepared for metadata: the record extends the
            # volume itself, and zeros must never be written over it, now or later.
            with self._zero_lock:
                self._fence = min(self._fence, off)
            self.allocated = self.tail
        self.appended += size
        if rtype == records.META:
            self._last_meta_end[vol] = self.tail
        ticket = self._next_ticket
        self._next_ticket += 1
        self._submit(_Queued(ticket, vol, off, parts, size, sync, ino if rtype == records.DATA else 0))
        self._inflight[(vol, off)] = parts
        self.queued_bytes += size
        if self._room() < PREALLOC_AHEAD - PREALLOC_STEP and self.allocated < self._limit:
            # Refill a step at a time: refilling from half empty wrote ~36 MiB of zeros
            # and their flushes in one burst, and the commits of that moment paid for it
            # (a dip in fio's size sweep wherever the burst fell). A volume prepared to
            # its end has nothing left to prepare: the roll-over asks for the next.
            self._grow_wanted.set()
        return vol, off, ticket

    @property
    def last_ticket(self) -> int:
        return self._next_ticket - 1

    async def wait_durable(self, ticket: int) -> None:
        """Wait until everything up to ticket is on disk and flushed."""
        while self._synced < ticket:
            if self.broken:
                raise FsError(errno.EIO, "write to the backing disk failed")
            flush_coming = self._syncs_in_hand or any(q.sync for q in self._pending)
            if not flush_coming and self._written >= ticket:
                # Nothing will flush on its own: ask for a flush after what is queued.
                self._submit(_Queued(0, self.active, -1, [], 0, True))
            await self._progress.wait()
        if self.broken and self._synced < ticket:
            raise FsError(errno.EIO, "write to the backing disk failed")

    async def wait_written(self, ticket: int) -> None:
        """Backpressure: wait until the writer has written up to ticket."""
        while self._written < ticket and not self.broken:
            await self._progress.wait()
        if self.broken:
            raise FsError(errno.EIO, "write to the backing disk failed")

    @property
    def writer_kind(self) -> str | None:
        return self._writer.kind if self._writer else None

    @property
    def threads_working(self) -> bool:
        """True while a thread of the store has work: the log writer with records in hand,
        or a worker reading a record. The event loop does not busy-poll then: a Python
        writer would wait for the GIL the polling loop holds, and the C one shares the two
        cores with the loop and the application (polling while it worked: Swift 4 KiB PUT
        at concurrency 16 ~6% slower, alternated runs)."""
        return self._outstanding > 0 or bool(self._loading)

    def _submit(self, q: _Queued) -> None:
        self._pending.append(q)
        if not self._batching:
            self._send()

    @contextlib.contextmanager
    def batch(self, wake: bool = True) -> Iterator[None]:
        """Queue the records appended inside as one batch: the writer gets them at once,
        after the last, so a commit's data and its META go out in one write (not a write
        for the data and a second one, and a second wake-up of the writer, for the META).
        With wake False the caller must call write_now, which writes the batch on the
        loop or hands it to the writer."""
        self._batching += 1
        try:
            yield
        finally:
            self._batching -= 1
            if not self._batching and wake:
                self._send()

    def _plan(self, batch: list[_Queued]) -> tuple[list[Op], int]:
        """The log writer's operations for a batch, and the file to flush after it (-1 for
        none). A record in a new volume comes after a flush of the previous one, so that
        recovery never finds a hole in an earlier volume under a later one."""
        ops: list[Op] = []
        for q in batch:
            if q.offset < 0:
                continue
            if q.volume != self._planned_volume and self._planned_volume:
                ops.append((self.fd(self._planned_volume), -1, None))
            self._planned_volume = q.volume
            fd, pos = self.fd(q.volume), q.offset
            for part in q.parts:  # contiguous: the writer makes them one pwritev
                ops.append((fd, pos, part))
                pos += len(part)
        sync = any(q.sync for q in batch)
        return ops, self.fd(self._planned_volume or self.active) if sync else -1

    def _send(self) -> None:
        """Submit the pending records to the writer as one batch (once it runs)."""
        if not self._pending or self._writer is None:
            return
        batch, self._pending = self._pending, []
        before = self._planned_volume
        ops, sync_fd = self._plan(batch)
        self._hand_over(batch, before, ops, sync_fd)

    def _hand_over(self, batch: list[_Queued], volume_before: int, ops: list[Op], sync_fd: int) -> None:
        assert self._writer is not None
        tag = self._next_tag
        self._next_tag += 1
        self._writer.submit(tag, ops, sync_fd)
        self._batches[tag] = batch, volume_before
        self._outstanding += len(batch)
        self._syncs_in_hand += sync_fd >= 0

    def write_now(self) -> bool:
        """On the loop: write and flush the pending records, if the writer has no batch in
        hand; False (the writer gets them) otherwise.

        For a commit nothing else waits behind (a lone fsync): handing the batch to the
        writer costs its wake-up and the way back to the loop (~0.1 ms with a Python
        thread, which also waited 0.15-0.4 ms for the GIL), around a ~0.5 ms flush. The
        loop is blocked while this runs; the syscalls release the GIL.
        """
        if not self._pending or self._writer is None or self.broken:
            self._send()
            return False
        batch, self._pending = self._pending, []
        before = self._planned_volume
        ops, sync_fd = self._plan(batch)
        result = self._writer.run_now(ops, sync_fd)
        if result is None:
            self._hand_over(batch, before, ops, sync_fd)
            return False
        self.flushes_on_loop += 1
        self._outstanding += len(batch)
        err, *counts = result
        self._account(batch, counts)
        self._batch_done(batch, err)
        return True

    async def run(self) -> None:
        """The log writer: a thread that writes submitted records in log order (see
        logwriter.py); this task accounts for each batch it has done.

        Cancelling waits for the take in flight, as a crash test expects of a stop;
        records not taken yet are not written, and go to the writer of the next run.
        """
        writer = self._writer = writer_for(self.disk)
        self._send()
        try:
            while True:
                await trio.lowlevel.wait_readable(writer.fileno())
                self._collect(writer)
        finally:
            self._writer = None
            writer.close()  # waits for the take in hand (the wait releases the GIL)
            self._collect(writer)
            self._requeue()

    def _collect(self, writer: LogWriter) -> None:
        for tag, err, *counts in writer.done():
            batch, _ = self._batches.pop(tag)
            self._account(batch, counts)
            self._syncs_in_hand -= any(q.sync for q in batch)
            self._batch_done(batch, err)

    def _requeue(self) -> None:
        """Put the batches a stopped writer did not take back in front of the pending."""
        if not self._batches:
            return
        dropped = [self._batches[tag] for tag in sorted(self._batches)]
        self._planned_volume = dropped[0][1]
        self._pending = [q for batch, _ in dropped for q in batch] + self._pending
        self._outstanding -= sum(len(batch) for batch, _ in dropped)
        self._syncs_in_hand = 0
        self._batches.clear()

    def _account(self, batch: list[_Queued], counts: list[int]) -> None:
        write_ns, flush_ns, writes, flushes = counts
        self.group.written(((q.ino, q.sync and q.offset >= 0) for q in batch), writes, flushes)
        if writes:
            self.writes += writes
            self.timings.record("disk_write", write_ns)
        if flushes:
            self.flushes += flushes
            self.timings.record("disk_flush", flush_ns)

    def _break(self, err: int) -> None:
        """Refuse every later write and fsync (as ext4 with errors=remount-ro) and wake waiters."""
        if not self.broken:
            self.broken = err
            log.error("the volume log is broken (%s): refusing further writes", os.strerror(err))
        self._progress.set()
        self._progress = trio.Event()

    def _batch_done(self, batch: list[_Queued], failed: int) -> None:
        """On the loop: account for a batch the writer has written (or not)."""
        self._outstanding -= len(batch)
        if failed:
            self._break(failed)
        for q in batch:
            if q.offset >= 0:
                self._inflight.pop((q.volume, q.offset), None)
                self.queued_bytes -= q.size
        if not self.broken:
            tickets = [q.ticket for q in batch if q.ticket]
            if tickets:
                self._written = max(self._written, max(tickets))
            if any(q.sync for q in batch):
                self._synced = self._written
                ends = [(q.volume, q.offset + q.size) for q in batch if q.offset >= 0]
                if ends:
                    self.durable_pos = max(self.durable_pos, max(ends))
        self._progress.set()
        self._progress = trio.Event()

    # -- reading ------------------------------------------------------------------

    async def read(self, volume: int, offset: int, length: int, ino: int, keep: bool = True) -> bytes | memoryview:
        """The verified payload of a DATA record (not to be changed); EIO if it is corrupt.

        keep: hold it in the read cache for the next reads of its other parts. A record the
        reader takes whole (every Swift object below disk_chunk_size) is not kept: the
        kernel keeps the file's pages, and the volume's stay in its page cache, so a copy
        here would only be a third one (~4 KiB of RSS per small object read, up to
        cache_size)."""
        queued = self._inflight.get((volume, offset))
        if queued is not None:
            return b"".join(queued)[records.HEADER_SIZE: records.HEADER_SIZE + length]
        k = (volume, offset)
        while (loading := self._loading.get(k)) is not None:
            await loading.wait()  # kernel readahead asks for one record many times at once
        cached = self._cache.get(k)
        if cached is not None:
            self._cache.move_to_end(k)
            return cached
        if length <= INLINE_READ_MAX:
            try:
                buf = self.disk.pread_cached(self.fd(volume), records.HEADER_SIZE + length, offset)
            except OSError as e:
                raise self._read_error(volume, offset, e) from e
            if buf is not None:
                payload = self._verified(buf, volume, offset, length, ino)
                if keep:
                    self._remember(k, payload)
                return payload
        self._loading[k] = done = trio.Event()
        self.reads_waited += 1
        try:
            payload = await trio.to_thread.run_sync(self._read_verified, volume, offset, length, ino)
            if keep:
                self._remember(k, payload)
        finally:
            del self._loading[k]
            done.set()
        return payload

    def prefetch(self, extents: list[ext.Extent]) -> None:
        """Start the disk reads of a file's first records, up to INLINE_READ_MAX bytes.

        Called at the first xattr read of a file: Swift reads the object's xattrs (five
        requests) before its data, and by then the records are in the page cache, so the
        read is served on the loop instead of waiting for the disk in a worker thread
        (measured on a cold 4 KiB object: 330 us of the read request).
        """
        budget = INLINE_READ_MAX
        for e in extents:
            k = (e[2], e[3])
            if budget < e[5] or k in self._cache or k in self._inflight:
                continue
            budget -= e[5]
            try:
                fd = self.fd(e[2])
            except OSError:
                return  # a volume that cannot be opened: the read will say so, not the open
            self.disk.prefetch(fd, records.HEADER_SIZE + e[5], e[3])
            self.prefetches += 1

    def _read_verified(self, volume: int, offset: int, length: int, ino: int) -> memoryview:
        try:
            buf = self.disk.pread(self.fd(volume), records.HEADER_SIZE + length, offset)
        except OSError as e:
            raise self._read_error(volume, offset, e) from e
        return self._verified(buf, volume, offset, length, ino)

    @staticmethod
    def _read_error(volume: int, offset: int, e: OSError) -> FsError:
        log.error("read error in %s at %d: %s", volume_name(volume), offset, e)
        return FsError(errno.EIO)

    def _verified(self, buf: bytes | bytearray, volume: int, offset: int, length: int, ino: int) -> memoryview:
        """The payload of a record read whole, a view into buf (no copy); EIO and a log
        line if it is not intact."""
        try:
            header = records.decode_header(buf, self.pack_id)
            payload = memoryview(buf)[records.HEADER_SIZE:]
            if header.rtype != records.DATA or header.ino != ino:
                raise records.RecordError("record belongs to another file")
            records.check_payload(header, payload)
        except records.RecordError as e:
            log.error("corrupt record in %s at %d (inode %d): %s", volume_name(volume), offset, ino, e)
            raise FsError(errno.EIO) from e
        return payload

    def read_trailer(self, volume: int, offset: int, length: int, ino: int) -> bytes:
        """The xattrs a file's DATA record of `length` payload bytes carries in its padding,
        checked; from any thread (a cold one waits for the disk). EIO and a log line if
        the record is not intact or carries none: the inode table said it does."""
        queued = self._inflight.get((volume, offset))
        try:
            if queued is not None:
                buf = b"".join(queued)
            else:
                buf = self.disk.pread(self.fd(volume), records.footprint(length), offset)
        except OSError as e:
            raise self._read_error(volume, offset, e) from e
        try:
            header = records.decode_header(buf, self.pack_id)
            if header.rtype != records.DATA or header.ino != ino or header.length != length:
                raise records.RecordError("record belongs to another file")
            return records.trailer_of(header, buf)
        except records.RecordError as e:
            log.error("corrupt record in %s at %d (inode %d): %s", volume_name(volume), offset, ino, e)
            raise FsError(errno.EIO) from e

    def _remember(self, k: tuple[int, int], payload: bytes) -> None:
        if len(payload) > self._cache_max // 4:
            return
        self._cache[k] = payload
        self._cache_bytes += len(payload)
        while self._cache_bytes > self._cache_max:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)

    # -- freeing ------------------------------------------------------------------

    async def punch(self, keys: list[tuple[int, int, int]], before_volume: int) -> None:
        """Return the blocks of dead records to the backing filesystem, durably.

        Volumes before `before_volume` (the checkpoint's) that are left with no data
        are removed: no record can be reserved in them any more.
        """
        if not keys:
            return
        for vol, off, rlen in keys:
            dropped = self._cache.pop((vol, off), None)
            if dropped is not None:
                self._cache_bytes -= len(dropped)
        await trio.to_thread.run_sync(self.punch_now, keys, before_volume)

    def punch_now(self, keys: list[tuple[int, int, int]], before_volume: int) -> None:
        """Punch (blocking; also used by recovery); punching a hole twice is harmless.
        Dead records that lie next to each other go in one punch (_runs)."""
        present = set(self.existing())
        touched = set()
        for vol, off, size in _runs(keys):
            if vol not in present:
                continue  # removed with its whole volume already
            try:
                self.disk.punch_hole(self.fd(vol), off, size)
            except OSError as e:  # the space stays used; fsck --repair can punch it later
                log.warning("punching %s at %d failed: %s", volume_name(vol), off, e)
                continue
            touched.add(vol)
            self.punched_bytes += size
        for vol in sorted(touched):
            self.disk.fdatasync(self.fd(vol))
        for vol in touched:
            if vol < before_volume and not self.disk.has_data(self.fd(vol)):
                # Every record of this old volume is dead and punched: drop the file.
                # Recovery never reads volumes before the checkpoint, and a lost unlink
                # leaves only an empty file behind.
                self.disk.close(self.fds.pop(vol))
                self.disk.remove(self.path(vol))
                log.info("removed empty volume %s", volume_name(vol))
