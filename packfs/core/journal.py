"""The journal: metadata records in the volume log, group commit, and checkpoints.

A commit appends every buffered write, then one META record holding a snapshot of
everything in the namespace that changed since the previous commit (whole inodes,
directory entries, shared-record counts), then waits for the flush that covers it.
Many fsyncs at once share one flush: the log writer takes whatever is queued as one
batch. Commits are global, so fsync(file) and fsync(dir) both make every earlier
change durable, which is more than the contract asks and never less.

A checkpoint writes what changed since the previous checkpoint to the catalog, with
the log position it reflects. Records that died before that position are punched only
then, so the part of the log that recovery replays never contains a punched record.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import logging
import marshal
import math
import time
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import trio

from ..errors import FsError
from ..namespace.changes import Changes
from ..namespace.namespace import Namespace
from ..store import extents as ext
from ..store import records
from ..store.volumes import Volumes
from .catalog import Catalog
from .writeback import WriteBehind

log = logging.getLogger(__name__)

MARSHAL_VERSION = 4
# A quiet disk (a commit interval without a commit) checkpoints if this many inodes changed
# or this many records died since the last checkpoint.
QUIET_CHECKPOINT_INODES = 10_000
QUIET_CHECKPOINT_FREES = 1_000
# A checkpoint or a background commit snapshots up to this many changed inodes, and as
# many entries, per turn of the event loop (and appends as many files' buffered data). In
# a daemon under a tree build, 2,000 took 20-38 ms of the loop a turn; with 500, the
# committer's turns took 9.5 ms at most, the checkpointer's 8.5 (bench.stalls).
SNAPSHOT_PART = 500
SNAPSHOT_ROUNDS = 3  # rounds of parts taking again what changed during the one before
# The xattr compressor's turn ends after 64 blobs (Swift's: ~28 KB, ~3.5 ms) or this many
# bytes of them, whichever comes first: 64 blobs of 64 KiB values held the loop 0.4 s.
COMPRESS_SLICE_BYTES = 64 << 10
# A commit the loop flushes itself leaves the compressor's turn for when the loop is idle,
# unless this many xattr blobs wait for it already (a loop never idle still compresses).
COMPRESS_DEFER_MAX = 64
T = TypeVar("T")


def encode(snap: Snapshot, next_ino: int, durable: tuple[int, int]) -> bytes:
    """A META payload: (inode rows, removed inodes, dirents, shared-record counts, next ino,
    the log position known flushed when it was written)."""
    return marshal.dumps((*snap, next_ino, durable), MARSHAL_VERSION)


def edited_maps(payload: bytes) -> list[int]:
    """The files whose maps a META payload logs as edits (format 5)."""
    return [row[0] for row in marshal.loads(payload)[0] if isinstance(row[12], list)]


def durable_position(payload: bytes) -> tuple[int, int]:
    """Where the log was known flushed when a META was written: damage before it is not a torn tail."""
    return tuple(marshal.loads(payload)[5])  # type: ignore[return-value]


def apply(ns: Namespace, payload: bytes, strict: bool = True) -> None:
    """Replay one META payload onto the namespace (recovery; not strict: see InodeTable.load)."""
    rows, removed, dirents, refs, next_ino = marshal.loads(payload)[:5]
    changed = Changes()
    for row in rows:
        ns.load_inode(row, strict)
        changed.inodes.add(row[0])
    for parent, name, ino in dirents:
        # A parent that is gone, or whose number a file took later in the same commit,
        # lost its entries with it (InodeTable.load drops a reused directory's entries).
        if ns.is_dir(parent):
            ns.load_dirent(parent, name, ino)
        changed.dirents.add((parent, name))
    for k, count in refs:
        ns.set_ref(tuple(k), count)
        changed.refs.add(tuple(k))
    for ino in removed:
        ns.drop_inode(ino)
        changed.inodes.add(ino)
    ns.catalog_changes.merge(changed)
    ns.next_ino = max(ns.next_ino, next_ino)


# (inode rows, removed inodes, dirents, shared-record counts) of some changes
Snapshot = tuple[list, list, list, list]


def snapshot(ns: Namespace, changes: Changes, journal: bool = False, edits: bool = False) -> Snapshot:
    """The rows of what changed, as now. journal: for a META (the catalog's otherwise):
    a long map's edits are followed from here on, and with edits a map followed since
    the previous META is logged as them (Namespace.take_extent_edits)."""
    rows, removed = [], []
    table = ns.table
    for ino in changes.inodes:
        if table.exists(ino):
            rows.append(table.row(ino, ns.take_extent_edits(ino, edits) if journal else None))
        else:
            removed.append(ino)
    dirents = [(p, name, ns.dirent(p, name)) for p, name in changes.dirents]
    refs = [(k, ns.refs.get(k, 1)) for k in changes.refs]
    return rows, removed, dirents, refs


# A round of a checkpoint's snapshot: each part's keys and their snapshot
Layer = list[tuple[Changes, Snapshot]]


def combine(layers: list[Layer]) -> Snapshot:
    """One snapshot of the layers (oldest first): each key as the newest layer that took it has it."""
    rows: list = []
    removed: list = []
    dirents: list = []
    refs: list = []
    inodes: set[int] = set()
    entries: set[tuple[int, bytes]] = set()
    shared: set[ext.RecordKey] = set()
    for layer in reversed(layers):
        for _, (r, gone, d, c) in layer:
            rows += [row for row in r if row[0] not in inodes]
            removed += [ino for ino in gone if ino not in inodes]
            dirents += [e for e in d if (e[0], e[1]) not in entries]
            refs += [k for k in c if k[0] not in shared]
        for keys, _ in layer:
            inodes |= keys.inodes
            entries |= keys.dirents
            shared |= keys.refs
    return rows, removed, dirents, refs


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection inside.

    A checkpoint holds lists and sets of every changed inode and entry (100,000s of
    references) for seconds. Every automatic collection walks each reference it reaches
    (a cache miss each) with the event loop held: 5-27 ms each, several per checkpoint,
    the longest waits a request saw. The checkpoint makes no reference cycles, and what
    requests make meanwhile is collected after it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def _nothing() -> None:
    pass


@dataclasses.dataclass
class _Compaction:
    """What a compaction of the xattr arena started from, for its log line."""
    started: float
    size: int
    free: int
    parts: int = 0


class Journal:
    def __init__(self, ns: Namespace, volumes: Volumes, wb: WriteBehind, catalog: Catalog,
                 checkpoint_bytes: int, replayed: list[ext.RecordKey]) -> None:
        self.ns = ns
        self.volumes = volumes
        self.wb = wb
        self.catalog = catalog
        self.checkpoint_bytes = checkpoint_bytes
        self.snapshot_part = SNAPSHOT_PART  # tests make it small, so that requests come between parts
        self._metas = list(replayed)  # META records since the last checkpoint
        self._appended_at_checkpoint = 0
        self._checkpoint_lock = trio.Lock()
        self._checkpoint_wanted = trio.Event()
        self._commit_wanted = trio.Event()
        self._compress_wanted = trio.Event()
        # Set by the daemon when the event loop calls when_idle before it sleeps.
        self.idle_hook = False
        self._compress_deferred = False
        self._compaction: _Compaction | None = None  # the xattr arena's, under way or last
        self._behind: Changes | None = None  # what a commit in parts took and has not staged
        ns.on_many_changes = lambda: self._commit_wanted.set()
        # Awaited once the store has freed much memory: after a checkpoint (the change sets
        # it wrote) and when the disk goes quiet after commits (their buffers). The daemon
        # hands the freed heap back to the kernel then.
        self.on_memory_freed: Callable[[], Awaitable[None]] = _nothing
        self._commits_freed = 0  # self.commits when on_memory_freed was last awaited
        self.commits = 0
        self.committed_at = 0.0  # time.monotonic() of the last commit, 0 before the first
        self.checkpoints = 0
        self.last_checkpoint_seconds = 0.0

    def _stage(self, wake: bool = True, behind: list[Layer] | None = None) -> None:
        """Synchronously queue all buffered data and one META of all changes, as one batch
        (see Volumes.batch for wake). behind: what a commit in parts snapshotted (see
        _commit_behind), its keys taken again if they changed since."""
        self._take_back()
        with self.volumes.batch(wake):
            self.wb.flush_all()
            changes = self.ns.take_journal_changes()
            if changes or behind:
                # Edits only in a META of one take: combine() keeps a key's newest row alone.
                snap = snapshot(self.ns, changes, journal=True, edits=not behind)
                if behind:
                    snap = combine([*behind, [(changes, snap)]])
                payload = encode(snap, self.ns.next_ino, self.volumes.durable_pos)
                vol, off, _ = self.volumes.append(records.META, 0, 0, payload, sync=True)
                self._metas.append((vol, off, len(payload)))
                self.commits += 1
                self.committed_at = time.monotonic()

    @property
    def pending_metas(self) -> list[ext.RecordKey]:
        """META records that die at the next checkpoint."""
        return self._metas

    def _take_back(self) -> None:
        """Give a commit in parts' changes back to the next commit, which stages them whole
        (their maps too: the edits before its takes went with them)."""
        if self._behind is not None:
            self.ns.journal_changes.update(self._behind)
            self.ns.forget_extent_edits(self._behind.inodes)
            self._behind = None

    @property
    def uncommitted_inodes(self) -> int:
        """Inodes changed since the last commit (a commit in parts' too: not committed yet)."""
        changed = self.ns.journal_changes.inodes
        return len(changed | self._behind.inodes if self._behind else changed)

    async def commit(self, alone: bool = False) -> None:
        """Make every change so far durable (fsync, fsyncdir). alone: no other request is
        in flight, so the loop writes and flushes the commit itself (Volumes.write_now)."""
        if not (self.ns.journal_changes or self.wb.dirty or self._behind or self.volumes.broken):
            # Nothing new (Swift's second and third fsyncdir of a PUT): wait only for what is
            # on its way, without waking the compressor, whose task switch delayed the reply ~20 us.
            await self._committed()
            return
        await self.volumes.ensure_space(records.BLOCK, metadata=True)  # buffered data holds its own
        self.volumes.note_commit(alone)
        self._stage(wake=not alone)
        if alone and self.idle_hook and self.ns.table.uncompressed() < COMPRESS_DEFER_MAX:
            # The loop flushes this commit itself, then replies: a compressor turn right
            # after would hold the requester's next request (a Swift PUT lists the
            # object's directory after its fsyncdir). It comes once the loop has no
            # request to read (when_idle): there, between two of Swift's PUTs.
            self._compress_deferred = True
        else:
            self._compress_wanted.set()  # runs while the log writer writes and flushes
        if alone:
            self.volumes.write_now()
        await self._committed()

    async def _commit_behind(self) -> None:
        """A commit nobody waits for (run_committer), snapshotted a part per turn of the
        event loop: at once, its 4,000 inodes and entries held the loop ~50 ms.

        As a checkpoint's, its snapshot takes again what changed during the parts, in parts
        too while that is more than a part (up to SNAPSHOT_ROUNDS rounds), then at once
        with the META's staging. The newest take of each key wins, so the META holds the
        namespace exactly as at its staging. Buffered data is appended first, a part per
        turn too: a file's extents change when it is, and would all be taken again at the
        staging (~10 us a file: 1,300 of Swift's held the loop 8-19 ms). A commit
        staged before this one (an fsync, a checkpoint) takes back what this one took
        and stages it itself: its META comes first in the log, so one written later from
        older takes would undo it.
        """
        dirty = list(self.wb.dirty.values())
        for start in range(0, len(dirty), self.snapshot_part):
            with self.volumes.batch():
                for node in dirty[start:start + self.snapshot_part]:
                    self.wb.flush(node)
            await trio.lowlevel.checkpoint()
        taken = self._behind = self.ns.take_journal_changes()
        layers: list[Layer] = []
        try:
            new = taken
            while True:
                layer = []
                for part in new.parts(self.snapshot_part):
                    layer.append((part, snapshot(self.ns, part, journal=True)))
                    await trio.lowlevel.checkpoint()
                    if self._behind is not taken:
                        return  # staged by another commit
                layers.append(layer)
                changed = self.ns.journal_changes
                if len(changed.inodes) + len(changed.dirents) <= self.snapshot_part or \
                        len(layers) >= SNAPSHOT_ROUNDS:
                    break
                new = self.ns.take_journal_changes()
                taken.update(new)
            await self.volumes.ensure_space(records.BLOCK, metadata=True)
        except BaseException:
            if self._behind is taken:
                self._take_back()
            raise
        if self._behind is not taken:
            return
        self._behind = None
        self._stage(behind=layers if taken else None)  # none taken: only buffered data to stage
        self._compress_wanted.set()
        await self._committed()

    async def _committed(self) -> None:
        """Wait until what was staged is durable; ask for a checkpoint if one is due."""
        await self.volumes.wait_durable(self.volumes.last_ticket)
        if self._checkpoint_lock.locked():
            return  # one is running: the first commit after it asks again if another is due
        if self.volumes.appended - self._appended_at_checkpoint > self.checkpoint_bytes or \
                self.ns.catalog_changes.inode_count > 200_000 or len(self.ns.frees) > 4096:
            self._checkpoint_wanted.set()

    async def reclaiming(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run fn; on ENOSPC, checkpoint to punch what died, then run it once more."""
        try:
            return await fn(*args, **kwargs)
        except FsError as e:
            if e.errno != errno.ENOSPC or not (self.ns.frees or self._metas):
                raise
        await self.checkpoint()
        return await fn(*args, **kwargs)

    async def checkpoint(self) -> None:
        """Commit, write the catalog, then punch the records that died before it.

        What changed is snapshotted a part per turn of the event loop: at once, 200,000
        changed inodes held the loop (and every request) for ~1 s. A part's rows may change
        before the last part is taken, so the checkpoint then commits and takes again what
        changed meanwhile: in parts too while that is more than a part (a round), and once it
        is small, or after SNAPSHOT_ROUNDS rounds, at once, with no turn of the loop after
        that commit (nor before the position and the dead records are taken). The newest
        take of each key wins, so the catalog holds the namespace exactly as at that
        commit; recovery replays what came after it.
        """
        async with self._checkpoint_lock:
            started = time.monotonic()
            with collector_paused():
                appended, volume, dead = await self._write_checkpoint()
            self._appended_at_checkpoint = appended
            await self.volumes.punch(dead, volume)
            self.checkpoints += 1
            self.last_checkpoint_seconds = time.monotonic() - started
        await self._memory_freed()

    async def _write_checkpoint(self) -> tuple[int, int, list[ext.RecordKey]]:
        """Snapshot and write the catalog (see checkpoint); give back the log's length and
        active volume at the catalog's position, and the records that died before it.
        Everything bulky (the takes, their rows) lives in this frame."""
        await self._compress_and_stage()
        taken = [self.ns.take_catalog_changes()]
        frees: list[ext.RecordKey] = []
        metas: list[ext.RecordKey] = []
        try:
            layers: list[Layer] = []
            while True:
                layer = []
                for part in taken[-1].parts(self.snapshot_part):
                    layer.append((part, snapshot(self.ns, part)))
                    await trio.lowlevel.checkpoint()
                layers.append(layer)
                await self._compress_and_stage()
                taken.append(self.ns.take_catalog_changes())
                if taken[-1].inode_count + len(taken[-1].parents) <= self.snapshot_part or \
                        len(taken) > SNAPSHOT_ROUNDS:
                    break  # small enough to take at once, with no turn after this commit
            last = taken[-1].changes()
            layers.append([(last, snapshot(self.ns, last))])
            appended = self.volumes.appended
            position = {"volume": self.volumes.active, "offset": self.volumes.tail,
                        "seq": self.volumes.seq, "next_ino": self.ns.next_ino}
            frees, metas = self.ns.take_frees(), self._metas
            self._metas = []
            await self.volumes.wait_durable(self.volumes.last_ticket)
            rows = await trio.to_thread.run_sync(self._write_catalog, layers, position, frees + metas)
        except BaseException:
            # Nothing was lost: what this checkpoint took goes into the next one.
            for pending in taken:
                self.ns.catalog_changes.extend(pending)
            self.ns.frees[:0] = frees
            self._metas[:0] = metas
            raise
        # A part per turn here too, from the end so that each is let go once done: freed at
        # once as this frame ended, 100,000 rows (a million objects) held the loop ~40 ms.
        part = self.snapshot_part
        while rows:
            self.ns.table.checkpointed(rows[-part:])
            del rows[-part:]
            await trio.lowlevel.checkpoint()
        for layer in layers:
            while layer:
                del layer[-1]
                await trio.lowlevel.checkpoint()
        return appended, position["volume"], frees + metas

    async def _compress_and_stage(self) -> None:
        """Before a take of a checkpoint's: compress every xattr blob stored plain, then
        commit, with no turn of the event loop between, so that the catalog (and the image
        made from it) gets the blobs small. A blob set plain during a round's parts is
        taken again by the next round, compressed by then, and the last round is taken at
        once. Compressing the blobs only before the first take left those set during the
        snapshot plain in the catalog: compressing them later changed no row (9-12% of
        an imported Swift tree's blobs, ~440 B each against ~60)."""
        table = self.ns.table
        while table.compress_xattrs(limit=64, budget=COMPRESS_SLICE_BYTES):
            await trio.lowlevel.checkpoint()
        await self.volumes.ensure_space(records.BLOCK, metadata=True)
        table.compress_xattrs()  # those set while the log grew, if it had to (a few)
        self._stage()

    def _write_catalog(self, layers: list[Layer], position: dict, dead: list[ext.RecordKey]) -> list:
        """Write the layers' snapshots as one, newest key first (in a worker thread)."""
        rows, removed, dirents, refs = combine(layers)
        self.catalog.checkpoint(rows, removed, dirents, refs, position, dead)
        return rows

    async def _memory_freed(self) -> None:
        self._commits_freed = self.commits
        await self.on_memory_freed()

    async def run_committer(self, interval: float) -> None:
        """Background task: commit what no fsync has, once COMMIT_INODES inodes changed or
        every `interval` seconds (0: never on a timer); tidy up once the disk is quiet.

        Nothing asks for that durability. The count bounds a commit's size (its META record
        and the memory to build it) and the replay after a crash. The interval bounds how
        old a change can be and still be lost when the daemon or the machine dies: without
        it, files nobody fsyncs (rsync's replication, an operator's copy) stayed in memory
        until some fsync came, on an idle disk for ever. ext4 commits every 5 s, XFS's log
        and the kernel's writeback every 30 s. No request waits on this timer.
        """
        failed = ""  # the last failure logged, so a full disk logs it once
        seen = self.commits  # at the previous turn
        while True:
            ticked = True
            with trio.move_on_after(interval or math.inf):
                await self._commit_wanted.wait()
                ticked = False
            self._commit_wanted = trio.Event()
            if self.volumes.broken:
                continue
            if self.ns.journal_changes or self.wb.dirty:
                try:
                    await self._commit_behind()
                    failed = ""
                except FsError as e:
                    if str(e) != failed:
                        log.warning("background commit failed: %s", e)
                    failed = str(e)
            elif ticked and self.commits == seen:
                await self._quiet()
            seen = self.commits

    async def _quiet(self) -> None:
        """A whole interval went by without a commit. Checkpoint if many changes or dead
        records wait for one: the dead records' disk space and the pending changes' memory
        come back now, and a crash replays less, rather than after `checkpoint_bytes` more
        of log. Else hand back the memory the commits freed."""
        if self.ns.catalog_changes.inode_count >= QUIET_CHECKPOINT_INODES or \
                len(self.ns.frees) >= QUIET_CHECKPOINT_FREES:
            self._checkpoint_wanted.set()  # the checkpoint hands its memory back after it
        elif self.commits != self._commits_freed:
            await self._memory_freed()

    def when_idle(self) -> None:
        """The event loop has no request to read and is about to sleep."""
        if self._compress_deferred:
            self._compress_deferred = False
            self._compress_wanted.set()

    async def run_xattr_compressor(self) -> None:
        """Background task: compress the xattrs setxattr (or a replay) stored plain, a slice
        at a time (64 of Swift's: ~3.5 ms), after each commit; Swift's metadata costs an
        eighth as much memory then."""
        table = self.ns.table
        while True:
            if table.compress_xattrs(limit=64, settled_only=True, budget=COMPRESS_SLICE_BYTES):
                await trio.lowlevel.checkpoint()  # let requests in between slices
            else:
                await self._compress_wanted.wait()
                self._compress_wanted = trio.Event()
                table.next_compress_turn()

    async def run_xattr_compactor(self) -> None:
        """Background task: compact the xattr arena in parts (InodeTable.compact_xattrs)
        as soon as a freed value makes it due. When it was checked only after commits, a
        minute of setxattrs without an fsync (a commit every `commit_interval`) let the
        arena grow to 1 GiB between two checks, and the daemon's RSS with it."""
        while True:
            wanted = trio.Event()
            self.ns.table.on_compaction_due = wanted.set
            await wanted.wait()
            while self._compact_xattrs():
                await trio.lowlevel.checkpoint()  # let requests in between parts

    def _compact_xattrs(self) -> bool:
        """A part of the xattr arena's compaction, if one is due or under way; True while
        it is. Logs what a whole one freed and took."""
        table = self.ns.table
        if not table.compacting_xattrs:
            if not table.xattr_compaction_due():
                return False
            size, free = table.xattr_arena_bytes()
            self._compaction = _Compaction(time.monotonic(), size, free)
        c = self._compaction
        assert c is not None
        c.parts += 1
        if table.compact_xattrs():
            return True
        log.info("xattr arena compacted: %.1f MiB of %.1f MiB were free; %d parts in %.3f s", c.free / 2**20,
                 c.size / 2**20, c.parts, time.monotonic() - c.started)
        return False

    def want_checkpoint(self) -> None:
        """Ask the checkpointer for a checkpoint now (after a recovery changed the table)."""
        self._checkpoint_wanted.set()

    async def run_checkpointer(self) -> None:
        """Background task: checkpoint when a commit finds the log grown by `checkpoint_bytes`
        or many changes or dead records waiting, or a quiet disk finds enough (`_quiet`)."""
        failed = ""  # the last failure logged: a quiet disk asks again every interval
        while True:
            await self._checkpoint_wanted.wait()
            self._checkpoint_wanted = trio.Event()
            try:
                await self.checkpoint()
                failed = ""
            except Exception as e:
                if repr(e) != failed:
                    log.exception("checkpoint failed; will retry at the next commit or quiet interval")
                failed = repr(e)
