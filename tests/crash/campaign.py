"""The power-cut campaign: a seeded random workload on packfs.core.filesystem.Filesystem (no
FUSE) over a FaultDisk, then a power cut at every flush boundary and at random points
between, real mount-time recovery on each crashed image, and a check of everything the
durability contract guarantees.

One run of a seed:

1. Initialise a pack whose volumes live on a recording FaultDisk (tests/faultdisk.py),
   with small chunks and small volumes so write-behind flushes and volume roll-overs
   happen often. Worker threads run inline, the log writer's takes are made by a task of
   the event loop (StepWriter) and trio's scheduler is seeded, so a seed always produces
   the same trace (with the writer's own thread, which takes whatever is queued when it
   wakes, three runs of seed 3901 had 775, 779 and 780 backing-disk events).
2. Run N random operations -- create, open (O_TRUNC), write at offsets (append,
   overwrite, sparse), release, fsync, fsyncdir, truncate, chmod, utime, setxattr,
   removexattr, rename of files and directories (replacing, RENAME_EXCHANGE,
   RENAME_NOREPLACE), link, unlink (also of open files), mkdir, rmdir, read, files made
   with no name (O_TMPFILE) and named later (linkat), holes punched and reservations and
   growth by fallocate, checkpoint
   (awaited, or in the background: its snapshot's parts of three keys each interleave
   with the next operations), group commits (two or three tasks changing files and
   fsyncing at once) -- and finally a clean close. Odd seeds also run the background
   checkpointer after every 128 KiB of log. A model applies each successful operation and keeps,
   per file and per directory entry, the history of its states. Every operation's start
   and end and every catalog checkpoint (a serialised copy of the SQLite database: a
   checkpoint transaction is atomic) are marked in the disk's trace.
3. For each chosen crash point (an index into the trace), rebuild the disk as it was
   there, cut the power (durable images plus a random subset of the unflushed writes,
   some torn), write the catalog as of that instant, recover with packfs.core.pack.open_pack
   and Filesystem.start (the post-recovery checkpoint), read the whole tree back, close,
   and check:

   - recovery works, and every file reads without error;
   - never garbage: every file's contents equal that file's contents at some operation
     boundary (no byte never written, never extended with zeros or stale data);
   - fsync(file) acknowledged at op i: the file's data and size, mode, mtime and xattrs
     are each those of op i or later;
   - fsync(dir) acknowledged at op i: every entry of the directory names what it named
     at op i or later (no lost create, no resurrected unlink, no phantom name);
   - rename is atomic: the two names show a pair they showed together at some operation
     boundary, never neither and never a mixture;
   - a clean close makes everything durable;
   - fsck of the recovered pack is clean (a dead record left unpunched, a leak, is a
     violation like any other finding), and fsck of the crashed image before recovery
     changes nothing and finds nothing but intact, unacknowledged commits behind a torn
     record (what a power cut inside a group commit leaves).

   The contract is all that is required. packfs's commits are global, so it gives more:
   the recovered tree is usually exactly the state after some operation; that is
   measured ("prefix states") but not required.

4. For some crash points, crash again *during* recovery (at every backing write and
   flush of the first recovery and its checkpoint) and recover again: the tree must be
   exactly the one a complete first recovery gives.
5. For some flush points, kill -9 instead of a power cut: the unflushed writes stay in
   the page cache (pending), the next mount recovers from them in the same boot, then a
   power cut at every step of that recovery or after it, and a second recovery: the
   contract must still hold for the first crash point.

Run it directly for a long campaign (make crash-campaign SEEDS=N):

    python tests/crash/campaign.py --seeds 50 --ops 300
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import multiprocessing
import os
import random
import shutil
import stat
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

import apsw  # noqa: E402
import trio  # noqa: E402

from faultdisk import FaultDisk  # noqa: E402
from packfs import fsck as fsckmod  # noqa: E402
from packfs.core import pack as packmod  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packfs.core.filesystem import (FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,  # noqa: E402
                               Filesystem, Setattr)
from packfs.namespace.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT  # noqa: E402
from packfs.store import volumes as volumes_mod  # noqa: E402
from packfs.fsck import scan as fsck_scan  # noqa: E402
from packfs.store.logwriter import ThreadWriter  # noqa: E402
from packfs.options import Options  # noqa: E402

KiB = 1 << 10
# fsck reads volumes in chunks (1 MiB), and a volume here (384 KiB) would fit in one:
# in chunks of 16 KiB, records cross a chunk's end and holes reach one as often as in
# a large volume (a chunk read off a block once hid every record after a hole).
fsck_scan.CHUNK = 16 * KiB


def options(seed: int = 0) -> Options:
    """Small chunks and volumes. Even seeds checkpoint only when the workload asks; odd
    seeds also let the background checkpointer run after every 128 KiB of log."""
    o = Options()
    o.disk_chunk_size = 16 * KiB      # write-behind flushes chunks often
    o.max_dirty = 256 * KiB           # backpressure kicks in
    o.volume_size = 384 * KiB         # volume roll-overs happen
    o.checkpoint_bytes = 128 * KiB if seed % 2 else 1 << 40
    o.cache_size = 32 * KiB
    o.commit_interval = 0          # a seed's trace must not depend on the clock
    return o


# -- determinism: worker threads inline, trio's scheduler seeded -------------------------

class StepWriter(ThreadWriter):
    """The log writer's contract with no thread: it takes every batch queued so far when
    the volumes' collecting task next runs (the eventfd is signalled at each submit), as
    the thread takes what is queued when it wakes, so batches still share a take (group
    commit); but which ones do is decided by trio's seeded scheduler, not by when a
    thread woke."""

    def __init__(self, disk: FaultDisk) -> None:  # (no thread: ThreadWriter's state only)
        self.disk = disk
        self._cond = threading.Condition()
        self._queued: list = []
        self._done: list = []
        self._in_hand = 0
        self._failed = 0
        self._stopping = False
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def submit(self, tag: int, ops: list, sync_fd: int) -> None:
        super().submit(tag, ops, sync_fd)
        os.eventfd_write(self._efd, 1)

    def done(self) -> list:
        take, self._queued = self._queued, []
        if take:
            err, counts = self._execute(take, self._failed)
            self._failed = err
            self._done.extend(self._results(take, err, counts))
        return super().done()

    def close(self) -> None:
        self._in_hand -= len(self._queued)
        self._queued = []
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    async def inline(fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    import trio._core._run as run
    saved = trio.to_thread.run_sync, volumes_mod.writer_for
    trio.to_thread.run_sync = inline  # type: ignore[assignment]
    volumes_mod.writer_for = StepWriter  # type: ignore[assignment]
    run._r.seed(seed)
    try:
        yield
    finally:
        trio.to_thread.run_sync, volumes_mod.writer_for = saved  # type: ignore[assignment]


def instrument_catalog(catalog: Any, disk: FaultDisk) -> None:
    """Mark every committed catalog checkpoint in the trace, with the database as committed."""
    orig = catalog.checkpoint

    def checkpoint(*args: Any, **kwargs: Any) -> None:
        with disk.lock:
            orig(*args, **kwargs)
            disk.mark("catalog", catalog.db.serialize("main"))

    catalog.checkpoint = checkpoint


# -- the model ----------------------------------------------------------------------------

def digest(b: bytes | bytearray) -> bytes:
    return hashlib.blake2b(bytes(b), digest_size=16).digest()


def xdigest(x: dict | None) -> bytes:
    return digest(repr(sorted((x or {}).items())).encode())


@dataclass
class MFile:
    content: bytearray = field(default_factory=bytearray)
    mode: int = stat.S_IFREG | 0o644
    mtime: int = 0
    xattrs: dict = field(default_factory=dict)
    nlink: int = 1
    opens: int = 0

    def sig(self) -> tuple:
        return (len(self.content), digest(self.content), self.mode, self.mtime, xdigest(self.xattrs), self.nlink)


# Fields of a file's signature the contract makes durable with fsync(file).
FIELDS = {"data": (0, 1), "mode": (2,), "mtime": (3,), "xattrs": (4,)}


class Model:
    """What the workload did, and every state each file and each entry went through."""

    def __init__(self) -> None:
        self.dirs: dict[int, dict[bytes, int]] = {ROOT: {}}
        self.parent: dict[int, int] = {ROOT: ROOT}
        self.files: dict[int, MFile] = {}
        self.fhist: dict[int, list[tuple[int, tuple | None]]] = defaultdict(list)
        self.ehist: dict[tuple[int, bytes], list[tuple[int, int | None]]] = defaultdict(list)
        self.dnames: dict[int, set[bytes]] = defaultdict(set)  # every name a directory ever had
        self.fsync_file: dict[int, list[int]] = defaultdict(list)
        self.fsync_dir: dict[int, list[int]] = defaultdict(list)
        self.fsync_all: list[int] = []  # clean close
        self.renames: list[tuple] = []  # (op, (d1, n1), (d2, n2), Y, X, exchange)
        self.sigs: list[bytes] = []  # whole-state signature after each op (index op + 1)
        self.ops: list[str] = []
        self.op = -1
        self._tf: set[int] = set()
        self._te: set[tuple[int, bytes]] = set()
        self.sigs.append(self.state_sig())

    # recording ------------------------------------------------------------------
    def touch_file(self, ino: int) -> None:
        self._tf.add(ino)

    def touch_entry(self, d: int, name: bytes) -> None:
        self._te.add((d, name))
        self.dnames[d].add(name)

    def end_op(self, fs: Filesystem) -> None:
        for ino in self._tf:
            f = self.files.get(ino)
            if f is not None:
                node = fs.ns.find(ino)
                if node is not None:
                    f.mtime = node.mtime
            sig = f.sig() if f is not None else None
            h = self.fhist[ino]
            if not h or h[-1][1] != sig:
                h.append((self.op, sig))
        for d, name in self._te:
            v = self.dirs.get(d, {}).get(name)
            h = self.ehist[(d, name)]
            if not h or h[-1][1] != v:
                h.append((self.op, v))
        self._tf.clear()
        self._te.clear()
        self.sigs.append(self.state_sig())

    def state_sig(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for d in sorted(self.dirs):
            h.update(repr((d, sorted(self.dirs[d].items()))).encode())
        for ino in sorted(self.files):
            f = self.files[ino]
            if f.nlink > 0:
                h.update(repr((ino, f.sig())).encode())
        return h.digest()

    # queries for checking -----------------------------------------------------------
    @staticmethod
    def window(hist: list[tuple[int, Any]], lo: int, hi: int) -> list:
        """Values in effect at some op in [lo, hi] (lo = -1: from the beginning)."""
        keys = [op for op, _ in hist]
        i = bisect_right(keys, lo) - 1
        out = [hist[i][1]] if i >= 0 else [None]
        out += [v for op, v in hist[i + 1:] if op <= hi]
        return out

    @staticmethod
    def joint(ha: list[tuple[int, Any]], hb: list[tuple[int, Any]], hi: int) -> set[tuple]:
        """Every (a, b) the two entries showed together at some op boundary up to hi."""
        out = {(None, None)}
        cur = [None, None]
        events = sorted([(op, 0, v) for op, v in ha] + [(op, 1, v) for op, v in hb], key=lambda t: (t[0], t[1]))
        for i, (op, which, v) in enumerate(events):
            if op > hi:
                break
            cur[which] = v
            if i + 1 == len(events) or events[i + 1][0] != op:  # only whole ops are boundaries
                out.add((cur[0], cur[1]))
        return out

    @staticmethod
    def last_ack(acks: list[int], done: int) -> int:
        i = bisect_right(acks, done) - 1
        return acks[i] if i >= 0 else -1


# -- the workload ---------------------------------------------------------------------------

FILE_NAMES = [f"f{i}".encode() for i in range(10)]
DIR_NAMES = [f"d{i}".encode() for i in range(4)]
XATTR_NAMES = [b"user.swift.metadata", b"user.swift.metadata1", b"user.a"]


class Workload:
    def __init__(self, fs: Filesystem, disk: FaultDisk, model: Model, rng: random.Random) -> None:
        self.fs, self.disk, self.m, self.rng = fs, disk, model, rng
        self.handles: list[tuple[int, int]] = []
        self.live_errors: list[str] = []

    # picking ---------------------------------------------------------------------
    def pick_dir(self) -> int:
        return self.rng.choice(sorted(self.m.dirs))

    def pick_file(self) -> int | None:
        live = sorted(i for i, f in self.m.files.items() if f.nlink > 0)
        return self.rng.choice(live) if live else None

    def pick_entry(self, want_dir: bool | None = None) -> tuple[int, bytes, int] | None:
        ents = [(d, n, i) for d in sorted(self.m.dirs) for n, i in sorted(self.m.dirs[d].items())
                if want_dir is None or (i in self.m.dirs) == want_dir]
        return self.rng.choice(ents) if ents else None

    def pick_handle(self) -> tuple[int, int] | None:
        if not self.handles or self.rng.random() < 0.1:
            ino = self.pick_file()
            if ino is None:
                return None
            self.handles.append((self.fs.open(ino), ino))
            self.m.files[ino].opens += 1
        return self.rng.choice(self.handles)

    # running -----------------------------------------------------------------------
    async def run(self, n: int) -> None:
        table = [
            (self.op_create, 10), (self.op_open, 4), (self.op_write, 22), (self.op_release, 7),
            (self.op_fsync, 9), (self.op_fsyncdir, 7), (self.op_truncate, 4), (self.op_chmod, 2),
            (self.op_utime, 2), (self.op_setxattr, 6), (self.op_removexattr, 2), (self.op_rename, 9),
            (self.op_link, 3), (self.op_unlink, 5), (self.op_mkdir, 4), (self.op_rmdir, 2),
            (self.op_read, 3), (self.op_checkpoint, 2), (self.op_checkpoint_behind, 2), (self.op_commit_behind, 2),
            (self.op_group_commit, 5), (self.op_tmpfile, 3), (self.op_name_tmpfile, 3), (self.op_fallocate, 4),
        ]
        fns, weights = zip(*table)
        for i in range(n):
            fn = self.rng.choices(fns, weights)[0]
            await self.step(i, fn)

    async def step(self, i: int, fn: Any) -> None:
        self.m.op = i
        self.disk.mark("op", i)
        desc = await fn()
        if self.rng.random() < 0.35:
            # Let the appender write what is queued (chunks, releases) in a batch of its
            # own, as it does while FUSE requests come and go.
            for _ in range(3):
                await trio.lowlevel.checkpoint()
        self.m.ops.append(desc or fn.__name__[3:] + " (nothing to do)")
        self.m.end_op(self.fs)
        self.disk.mark("done", i)

    async def close(self, i: int) -> None:
        async def op_close() -> str:
            for fh, ino in list(self.handles):
                await self._release(fh, ino)
            await self.fs.close()
            self.m.fsync_all.append(i)
            return "close (clean unmount)"
        await self.step(i, op_close)

    # operations ----------------------------------------------------------------------
    async def op_create(self) -> str | None:
        d, name = self.pick_dir(), self.rng.choice(FILE_NAMES)
        try:
            node = self.fs.create(d, name, stat.S_IFREG | 0o644, 0, 0)
        except FsError as e:
            return f"create {d}/{name!r}: {errno.errorcode[e.errno]}"
        self.m.files[node.ino] = MFile()
        self.m.dirs[d][name] = node.ino
        self.m.touch_file(node.ino)
        self.m.touch_entry(d, name)
        fh = self.fs.open(node.ino)
        self.m.files[node.ino].opens += 1
        self.handles.append((fh, node.ino))
        return f"create {d}/{name!r} -> {node.ino}"

    async def op_open(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        trunc = self.rng.random() < 0.25
        fh = self.fs.open(ino, truncate=trunc)
        f = self.m.files[ino]
        f.opens += 1
        if trunc:  # an empty file's times change too
            f.content = bytearray()
            self.m.touch_file(ino)
        self.handles.append((fh, ino))
        return f"open {ino}{' O_TRUNC' if trunc else ''}"

    async def op_write(self) -> str | None:
        h = self.pick_handle()
        if h is None:
            return None
        fh, ino = h
        f = self.m.files[ino]
        r = self.rng.random()
        size = len(f.content)
        if r < 0.5 or size == 0:
            off = size
        elif r < 0.8:
            off = self.rng.randrange(size)
        else:
            off = size + self.rng.randrange(1, 20 * KiB)
        n = int(2 ** self.rng.uniform(0, 15.5))  # 1 B .. ~46 KiB, log-uniform
        data = self.rng.randbytes(n)
        await self.fs.write(fh, off, data)
        if off > len(f.content):
            f.content += bytes(off - len(f.content))
        f.content[off:off + n] = data
        self.m.touch_file(ino)
        return f"write {ino} [{off}, +{n})"

    async def _release(self, fh: int, ino: int) -> None:
        self.handles.remove((fh, ino))
        await self.fs.release(fh)
        f = self.m.files[ino]
        f.opens -= 1
        if f.nlink == 0 and f.opens == 0:
            del self.m.files[ino]
            self.m.touch_file(ino)

    async def op_release(self) -> str | None:
        if not self.handles:
            return None
        fh, ino = self.rng.choice(self.handles)
        await self._release(fh, ino)
        return f"release {ino}"

    async def op_fsync(self) -> str | None:
        h = self.pick_handle()
        if h is None:
            return None
        await self.fs.fsync(fh=h[0])
        self.m.fsync_file[h[1]].append(self.m.op)
        return f"fsync {h[1]}"

    async def op_fsyncdir(self) -> str:
        d = self.pick_dir()
        await self.fs.fsync()
        self.m.fsync_dir[d].append(self.m.op)
        return f"fsyncdir {d}"

    async def op_truncate(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        f = self.m.files[ino]
        size = self.rng.choice([0, len(f.content) // 2, len(f.content) + self.rng.randrange(1, 30 * KiB),
                                max(0, len(f.content) - self.rng.randrange(1, 5000))])
        await self.fs.setattr(ino, Setattr(size=size))
        if size < len(f.content):
            del f.content[size:]
        else:
            f.content += bytes(size - len(f.content))
        self.m.touch_file(ino)
        return f"truncate {ino} to {size}"

    async def op_chmod(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        mode = self.rng.choice([0o600, 0o644, 0o755, 0o400])
        await self.fs.setattr(ino, Setattr(mode=mode))
        self.m.files[ino].mode = stat.S_IFREG | mode
        self.m.touch_file(ino)
        return f"chmod {ino} {mode:o}"

    async def op_utime(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        t = self.rng.randrange(1, 2 ** 62)
        await self.fs.setattr(ino, Setattr(mtime=t, atime=t))
        self.m.touch_file(ino)
        return f"utime {ino}"

    async def op_setxattr(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        name = self.rng.choice(XATTR_NAMES)
        value = self.rng.randbytes(65536 if self.rng.random() < 0.03 else self.rng.randrange(0, 1500))
        self.fs.setxattr(ino, name, value)
        self.m.files[ino].xattrs[name] = value
        self.m.touch_file(ino)
        return f"setxattr {ino} {name.decode()} ({len(value)} B)"

    async def op_removexattr(self) -> str | None:
        ino = self.pick_file()
        if ino is None:
            return None
        name = self.rng.choice(XATTR_NAMES)
        try:
            self.fs.removexattr(ino, name)
        except FsError as e:
            if name in self.m.files[ino].xattrs:
                self.live_errors.append(f"op {self.m.op}: removexattr {name!r} failed but the model has it")
            return f"removexattr {ino} {name.decode()}: {errno.errorcode[e.errno]}"
        del self.m.files[ino].xattrs[name]
        self.m.touch_file(ino)
        return f"removexattr {ino} {name.decode()}"

    async def op_rename(self) -> str | None:
        src = self.pick_entry()
        if src is None:
            return None
        d1, n1, y = src
        d2 = self.pick_dir()
        n2 = self.rng.choice(DIR_NAMES if y in self.m.dirs and self.rng.random() < 0.7 else FILE_NAMES)
        r = self.rng.random()
        flags = RENAME_EXCHANGE if r < 0.06 else RENAME_NOREPLACE if r < 0.1 else 0
        x = self.m.dirs[d2].get(n2)
        try:
            self.fs.rename(d1, n1, d2, n2, flags)
        except FsError as e:
            return f"rename {d1}/{n1!r} -> {d2}/{n2!r} flags {flags}: {errno.errorcode[e.errno]}"
        m = self.m
        desc = f"rename {d1}/{n1!r} ({y}) -> {d2}/{n2!r} ({x}) flags {flags}"
        if flags & RENAME_EXCHANGE:
            m.dirs[d1][n1], m.dirs[d2][n2] = x, y  # type: ignore[assignment]
            for ino, d in ((y, d2), (x, d1)):
                if ino in m.dirs:
                    m.parent[ino] = d
            m.renames.append((m.op, (d1, n1), (d2, n2), y, x, True))
        else:
            if x == y:
                return desc + " (same inode: nothing)"
            if x is not None:
                if x in m.dirs:
                    del m.dirs[x]
                    del m.parent[x]
                else:
                    self._drop_link(x)
            del m.dirs[d1][n1]
            m.dirs[d2][n2] = y
            if y in m.dirs:
                m.parent[y] = d2
            m.renames.append((m.op, (d1, n1), (d2, n2), y, x, False))
        m.touch_entry(d1, n1)
        m.touch_entry(d2, n2)
        if y in m.files:
            m.touch_file(y)
        return desc

    def _drop_link(self, ino: int) -> None:
        f = self.m.files[ino]
        f.nlink -= 1
        if f.nlink == 0 and f.opens == 0:
            del self.m.files[ino]
        self.m.touch_file(ino)

    async def op_link(self) -> str | None:
        ino = self.pick_file()
        return None if ino is None else self._link(ino, "link")

    def _link(self, ino: int, what: str) -> str:
        d, name = self.pick_dir(), self.rng.choice(FILE_NAMES)
        try:
            self.fs.link(ino, d, name)
        except FsError as e:
            return f"{what} {ino} as {d}/{name!r}: {errno.errorcode[e.errno]}"
        self.m.dirs[d][name] = ino
        self.m.files[ino].nlink += 1
        self.m.touch_entry(d, name)
        self.m.touch_file(ino)
        return f"{what} {ino} as {d}/{name!r}"

    async def op_tmpfile(self) -> str | None:
        d = self.pick_dir()
        node = self.fs.create_unlinked(d, stat.S_IFREG | 0o600, 0, 0)
        self.m.files[node.ino] = MFile(mode=stat.S_IFREG | 0o600, nlink=0, opens=1)
        self.m.touch_file(node.ino)
        self.handles.append((self.fs.open(node.ino), node.ino))
        return f"tmpfile in {d} -> {node.ino}"

    async def op_name_tmpfile(self) -> str | None:
        unnamed = sorted({ino for _, ino in self.handles if ino in self.fs.ns.linkable})
        return self._link(self.rng.choice(unnamed), "linkat") if unnamed else None

    async def op_fallocate(self) -> str | None:
        h = self.pick_handle()
        if h is None:
            return None
        ino = h[1]
        f = self.m.files[ino]
        mode = self.rng.choice([FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE] * 3 + [
            0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE])
        off = self.rng.randrange(len(f.content) + 1)
        n = int(2 ** self.rng.uniform(0, 16))
        self.fs.fallocate(ino, mode, off, n)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            end = min(off + n, len(f.content))
            f.content[off:end] = bytes(max(0, end - off))
        if not mode & FALLOC_FL_KEEP_SIZE and off + n > len(f.content):
            f.content += bytes(off + n - len(f.content))
        self.m.touch_file(ino)
        return f"fallocate {ino} mode {mode} [{off}, +{n})"

    async def op_unlink(self) -> str | None:
        e = self.pick_entry(want_dir=False)
        if e is None:
            return None
        d, name, ino = e
        self.fs.unlink(d, name)
        del self.m.dirs[d][name]
        self.m.touch_entry(d, name)
        self._drop_link(ino)
        return f"unlink {d}/{name!r} ({ino})"

    async def op_mkdir(self) -> str | None:
        if len(self.m.dirs) >= 9:
            return None
        d, name = self.pick_dir(), self.rng.choice(DIR_NAMES)
        try:
            node = self.fs.create(d, name, stat.S_IFDIR | 0o755, 0, 0)
        except FsError as e:
            return f"mkdir {d}/{name!r}: {errno.errorcode[e.errno]}"
        self.m.dirs[node.ino] = {}
        self.m.parent[node.ino] = d
        self.m.dirs[d][name] = node.ino
        self.m.touch_entry(d, name)
        return f"mkdir {d}/{name!r} -> {node.ino}"

    async def op_rmdir(self) -> str | None:
        e = self.pick_entry(want_dir=True)
        if e is None:
            return None
        d, name, ino = e
        try:
            self.fs.rmdir(d, name)
        except FsError as err:
            return f"rmdir {d}/{name!r}: {errno.errorcode[err.errno]}"
        del self.m.dirs[d][name]
        del self.m.dirs[ino]
        del self.m.parent[ino]
        self.m.touch_entry(d, name)
        return f"rmdir {d}/{name!r} ({ino})"

    async def op_read(self) -> str | None:
        h = self.pick_handle()
        if h is None:
            return None
        fh, ino = h
        want = bytes(self.m.files[ino].content)
        got = await self.fs.read(fh, 0, len(want) + 100)
        if got != want:
            self.live_errors.append(f"op {self.m.op}: live read of {ino} differs from what was written "
                                    f"({len(got)} vs {len(want)} bytes)")
        return f"read {ino}"

    async def op_group_commit(self) -> str | None:
        """Two or three writers change different files and fsync at once: one flush, several commits."""
        files = sorted({ino for _, ino in self.handles})
        self.rng.shuffle(files)
        files = files[:self.rng.randrange(2, 4)]
        if len(files) < 2:
            return None
        plan = []
        for ino in files:
            kind = self.rng.choice(["write", "setxattr", "utime"])
            fh = next(fh for fh, i in self.handles if i == ino)
            f = self.m.files[ino]
            if kind == "write":
                off = len(f.content) if self.rng.random() < 0.7 else self.rng.randrange(len(f.content) + 1)
                plan.append((kind, ino, fh, off, self.rng.randbytes(self.rng.randrange(1, 40 * KiB))))
            elif kind == "setxattr":
                plan.append((kind, ino, fh, self.rng.choice(XATTR_NAMES), self.rng.randbytes(self.rng.randrange(600))))
            else:
                plan.append((kind, ino, fh, self.rng.randrange(1, 2 ** 62), None))

        async def one(kind: str, ino: int, fh: int, a: Any, b: Any) -> None:
            if kind == "write":
                await self.fs.write(fh, a, b)
            elif kind == "setxattr":
                self.fs.setxattr(ino, a, b)
            else:
                await self.fs.setattr(ino, Setattr(mtime=a, atime=a))
            await self.fs.fsync(fh=fh)

        async with trio.open_nursery() as nursery:
            for p in plan:
                nursery.start_soon(one, *p)
        for kind, ino, fh, a, b in plan:
            f = self.m.files[ino]
            if kind == "write":
                if a > len(f.content):
                    f.content += bytes(a - len(f.content))
                f.content[a:a + len(b)] = b
            elif kind == "setxattr":
                f.xattrs[a] = b
            self.m.touch_file(ino)
            self.m.fsync_file[ino].append(self.m.op)
        return "group commit: " + ", ".join(f"{k} {ino}" for k, ino, *_ in plan)

    async def op_checkpoint(self) -> str:
        await self.fs.journal.checkpoint()
        return "checkpoint"

    async def op_checkpoint_behind(self) -> str:
        self.fs.journal._checkpoint_wanted.set()  # the checkpointer's parts interleave with the next operations
        await trio.lowlevel.checkpoint()  # it takes its first part now
        return "checkpoint in the background"

    async def op_commit_behind(self) -> str:
        self.fs.journal._commit_wanted.set()  # the committer's parts interleave with the next operations
        await trio.lowlevel.checkpoint()  # it appends its first part of buffered data now
        return "commit in the background"


# -- recovered trees -------------------------------------------------------------------------

@dataclass
class Tree:
    dirs: dict[int, dict[bytes, int]]
    files: dict[int, tuple]  # ino -> sig
    reachable: set[int]
    errors: list[str]

    def sig(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for d in sorted(self.dirs):
            h.update(repr((d, sorted(self.dirs[d].items()))).encode())
        for ino in sorted(self.files):
            if self.files[ino][5] > 0:
                h.update(repr((ino, self.files[ino])).encode())
        return h.digest()


async def read_tree(fs: Filesystem) -> Tree:
    t = Tree({}, {}, set(), [])
    for node in list(fs.ns):
        if node.is_dir:
            t.dirs[node.ino] = dict(node.children())
        elif node.is_reg:
            try:
                fh = fs.open(node.ino)
                try:
                    data = await fs.read(fh, 0, node.size + 1)
                finally:
                    await fs.release(fh)
            except FsError as e:
                t.errors.append(f"reading inode {node.ino} fails: {errno.errorcode.get(e.errno, e.errno)}")
                data = b"\0unreadable"
            if len(data) != node.size:
                t.errors.append(f"inode {node.ino}: size {node.size} but {len(data)} bytes read")
            t.files[node.ino] = (len(data), digest(data), node.mode, node.mtime, xdigest(dict(node.xattrs or {})), node.nlink)
    stack = [ROOT]
    while stack:
        d = stack.pop()
        if d in t.reachable:
            continue
        t.reachable.add(d)
        for ino in t.dirs.get(d, {}).values():
            if ino in t.dirs:
                stack.append(ino)
            else:
                t.reachable.add(ino)
    return t


# -- checking one recovered tree against the contract ------------------------------------------

def check_contract(m: Model, t: Tree, done: int, hi: int) -> list[str]:
    """Violations of the durability contract in tree t after a crash during op hi (done = last completed)."""
    bad: list[str] = list(t.errors)
    all_acks = m.fsync_all
    clean = Model.last_ack(all_acks, done)
    for ino, sig in sorted(t.files.items()):
        h = m.fhist.get(ino)
        if not h:
            bad.append(f"inode {ino} exists but was never created")
            continue
        states = [v for op, v in h if op <= hi and v is not None]
        if not any(sig[:2] == s[:2] for s in states):
            bad.append(f"inode {ino}: contents ({sig[0]} bytes) are no state the file ever had "
                       "(garbage, zeros or stale data)")
            continue
        acked = max(Model.last_ack(m.fsync_file.get(ino, []), done), clean)
        if acked < 0:
            continue
        window = [v for v in Model.window(h, acked, hi) if v is not None]
        for fname, idx in FIELDS.items():
            if not any(tuple(sig[i] for i in idx) == tuple(v[i] for i in idx) for v in window):
                bad.append(f"inode {ino}: {fname} is older than its fsync at op {acked}")
    for d, entries in sorted(t.dirs.items()):
        if d not in m.parent and d != ROOT:
            if d not in {v for h in m.ehist.values() for _, v in h}:
                bad.append(f"directory {d} exists but was never created")
            continue
        acked = max(Model.last_ack(m.fsync_dir.get(d, []), done), clean)
        for name in sorted(set(entries) | m.dnames.get(d, set())):
            got = entries.get(name)
            hist = m.ehist.get((d, name), [])
            allowed = Model.window(hist, acked, hi) if acked >= 0 else [None] + [v for op, v in hist if op <= hi]
            if got not in allowed:
                what = "lost" if got is None else f"names inode {got}"
                bad.append(f"entry {d}/{name!r} {what}; allowed {allowed} (fsyncdir at op {acked})")
            if got is not None and got not in t.files and got not in t.dirs:
                bad.append(f"entry {d}/{name!r} names inode {got}, which does not exist")
    for op, a, b, y, x, exchange in m.renames:
        if op > hi or a[0] not in t.dirs or b[0] not in t.dirs:
            continue
        pair = (t.dirs[a[0]].get(a[1]), t.dirs[b[0]].get(b[1]))
        joint = Model.joint(m.ehist.get(a, []), m.ehist.get(b, []), hi)
        if pair not in joint:
            bad.append(f"rename at op {op} of inode {y} {a} -> {b} is not atomic: the two names show {pair}, "
                       f"which they never showed together ({sorted(joint, key=repr)})")
    return bad


# -- one seed --------------------------------------------------------------------------------

@dataclass
class Result:
    seed: int
    ops: int = 0
    trace: int = 0
    crash_points: int = 0
    recovery_crash_points: int = 0
    violations: list[str] = field(default_factory=list)
    leaks: int = 0
    leak_points: int = 0
    raw_lost_commits: int = 0
    kill_points: int = 0
    prefix: int = 0
    lag: int = 0
    torn: int = 0
    dropped: int = 0
    seconds: float = 0.0


def write_catalog(root: str, blob: bytes) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, "catalog.sqlite" + suffix))
    with open(os.path.join(root, "catalog.sqlite"), "wb") as f:
        f.write(blob)


class Runner:
    def __init__(self, seed: int, n_ops: int, workdir: str, random_points: int = 40,
                 boundary_fraction: float = 1.0, recovery_crashes: int = 3, modes: tuple = ("random", "none", "all"),
                 extra_random: int = 3, raw_fsck: bool = True, kill_crashes: int = 3) -> None:
        self.kill_crashes = kill_crashes  # kill -9 points: recover in the same boot, then cut the power
        self.raw_fsck = raw_fsck  # also fsck each crashed image before recovering it
        self.extra_random = extra_random  # more random cuts where unflushed writes are pending
        self.seed = seed
        self.n_ops = n_ops
        self.workdir = workdir
        self.random_points = random_points
        self.boundary_fraction = boundary_fraction
        self.recovery_crashes = recovery_crashes
        self.modes = modes
        self.opts = options(seed)
        self.res = Result(seed)

    # the run ------------------------------------------------------------------------
    def record(self) -> tuple[FaultDisk, Model, bytes, list[str]]:
        root = os.path.join(self.workdir, "live")
        disk = FaultDisk(root)
        packmod.initialise(root, disk)
        marker = open(os.path.join(root, packmod.MARKER), "rb").read()
        c = apsw.Connection(os.path.join(root, "catalog.sqlite"))
        disk.mark("catalog", c.serialize("main"))
        c.close()
        model = Model()
        rng = random.Random(self.seed)
        live_errors: list[str] = []

        async def main() -> None:
            pk = packmod.open_pack(root, disk, self.opts.volume_size, self.opts.cache_size)
            instrument_catalog(pk.catalog, disk)
            fs = Filesystem(pk, self.opts, disk)
            fs.journal.snapshot_part = 3  # background checkpoints' and commits' parts interleave with operations
            fs.ns.journal_edits_min = 2  # nearly every map written twice is journaled as its edits
            async with trio.open_nursery() as nursery:
                await fs.start(nursery)
                w = Workload(fs, disk, model, rng)
                await w.run(self.n_ops)
                live = await read_tree(fs)
                live_errors.extend(w.live_errors)
                live_errors.extend(f"live: {v}" for v in check_contract(model, live, self.n_ops - 1, self.n_ops - 1))
                if live.sig() != model.sigs[-1]:
                    live_errors.append("live: the tree differs from the model's")
                await w.close(self.n_ops)
                nursery.cancel_scope.cancel()
            pk.volumes.close()
            pk.catalog.close()

        with deterministic(self.seed):
            trio.run(main)
        return disk, model, marker, live_errors

    def run(self) -> Result:
        t0 = time.monotonic()
        disk, model, marker, live_errors = self.record()
        self.res.violations += [f"seed {self.seed}: {v}" for v in live_errors]
        self.res.ops = self.n_ops + 1
        self.res.trace = len(disk.trace)
        points = self.choose_points(disk.trace)
        crash_root = os.path.join(self.workdir, "crash")
        os.makedirs(os.path.join(crash_root, "volumes"), exist_ok=True)
        with open(os.path.join(crash_root, packmod.MARKER), "wb") as f:
            f.write(marker)
        rng = random.Random(self.seed * 7919 + 1)
        recovery_crash_at = set(rng.sample(sorted(points), min(self.recovery_crashes, len(points))))
        flushes = [i for i, ev in enumerate(disk.trace) if ev[0] == "fdatasync"]  # unflushed writes just before
        kill_at = set(rng.sample(flushes, min(self.kill_crashes, len(flushes))))
        points |= kill_at
        # Walk the trace once; at each chosen point, cut the power.
        marks = self.index_marks(disk.trace)
        for k, sim in FaultDisk.replayer(disk.trace, disk.root):
            if k not in points:
                continue
            done, hi, blob = self.state_at(marks, k)
            if k in kill_at:
                self.kill_then_power_cut(crash_root, sim, blob, model, done, hi, rng,
                                         f"seed {self.seed} kill -9 at {k}/{len(disk.trace)} during op {hi}")
            pending = sim.pending_ops()
            writes = any(op[0] == "pwrite" for st in sim.files.values() for op in st.pending)
            modes = list(self.modes) + ["random"] * (self.extra_random if writes else 0)
            for mode in modes:
                if pending == 0 and mode != modes[0]:
                    continue  # nothing unflushed: every mode gives the same image
                image, cut = sim.power_cut(rng, mode, root=crash_root)
                self.res.torn += cut.torn
                self.res.dropped += cut.dropped
                where = f"seed {self.seed} crash point {k}/{len(disk.trace)} ({mode}) during op {hi}: " \
                        f"{model.ops[hi] if 0 <= hi < len(model.ops) else 'setup'}"
                base = image.snapshot() if k in recovery_crash_at and mode == "random" else None
                tree, problems = self.recover_and_check(crash_root, image, blob, model, done, hi)
                self.res.crash_points += 1
                self.res.violations += [f"{where}: {p}" for p in problems]
                if base is not None and tree is not None:
                    self.crash_during_recovery(crash_root, base, blob, tree, where, rng)
        self.res.seconds = time.monotonic() - t0
        return self.res

    def choose_points(self, trace: list[tuple]) -> set[int]:
        rng = random.Random(self.seed * 31 + 7)
        pts: set[int] = set()
        for i, ev in enumerate(trace):
            if ev[0] in ("fdatasync", "fsync_dir") or (ev[0] == "mark" and ev[1] == "catalog"):
                if rng.random() < self.boundary_fraction:
                    pts.update((i, i + 1))
        pts.update(rng.sample(range(len(trace) + 1), min(self.random_points, len(trace) + 1)))
        return pts

    @staticmethod
    def index_marks(trace: list[tuple]) -> list[tuple[int, str, Any]]:
        return [(i, ev[1], ev[2]) for i, ev in enumerate(trace) if ev[0] == "mark"]

    @staticmethod
    def state_at(marks: list[tuple[int, str, Any]], k: int) -> tuple[int, int, bytes]:
        done, started, blob = -1, -1, b""
        for i, label, data in marks:
            if i >= k:
                break
            if label == "op":
                started = data
            elif label == "done":
                done = data
            elif label == "catalog":
                blob = data
        hi = started if started > done else done
        if not blob:  # before the first mark: the catalog the pack was initialised with
            blob = next((data for _, label, data in marks if label == "catalog"), b"")
        return done, hi, blob

    # recovery -----------------------------------------------------------------------------
    def recover(self, root: str, image: FaultDisk, blob: bytes, instrument: bool = False
                ) -> tuple[Tree | None, list[str], tuple[int, int]]:
        write_catalog(root, blob)
        c = apsw.Connection(os.path.join(root, "catalog.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
        s = dict(c.execute("SELECT key, value FROM settings"))
        c.close()
        position = (s["volume"], s["offset"])
        out: dict[str, Any] = {}

        async def main() -> None:
            pk = packmod.open_pack(root, image, self.opts.volume_size, self.opts.cache_size)
            if instrument:
                instrument_catalog(pk.catalog, image)
            fs = Filesystem(pk, self.opts, image)
            try:
                async with trio.open_nursery() as nursery:
                    await fs.start(nursery)
                    out["tree"] = await read_tree(fs)
                    await fs.close()
                    nursery.cancel_scope.cancel()
            finally:
                pk.volumes.close()
                pk.catalog.close()

        try:
            with deterministic(self.seed):
                trio.run(main)
        except Exception as e:  # noqa: BLE001 - any failure to recover is a violation
            return None, [f"recovery failed: {type(e).__name__}: {e}"], position
        return out["tree"], [], position

    def fsck_problems(self, root: str, image: FaultDisk, position: tuple[int, int], raw: bool = False) -> list[str]:
        """fsck's problems (leaks counted too). raw: an unrecovered image, which fsck must not change."""
        image.record, image.trace = raw, []
        rep = fsckmod.check(root, disk=image)
        image.record = False
        out = []
        leaks = 0
        if raw and any(ev[0] not in ("mark", "fail") for ev in image.trace):
            out.append(f"fsck without --repair changed the disk: {sorted({ev[0] for ev in image.trace})}")
        for f in rep.problems:
            if f.kind in ("orphan-record", "stale-meta") and f.keys and (f.keys[0][0], f.keys[0][1]) < position:
                leaks += 1  # a dead record before the checkpoint nobody will punch: a violation too
            if raw and f.kind == "lost-commits":
                # Commits behind a torn record in the last, unflushed write batch: a crash
                # during a group commit looks like that (none of them was acknowledged).
                self.res.raw_lost_commits += 1
                continue
            out.append(f"fsck{' of the unrecovered image' if raw else ''}: {f.kind}: {f.message}")
        if not raw:
            self.res.leaks += leaks
            self.res.leak_points += leaks > 0
        if rep.error:
            out.append(f"fsck could not run: {rep.error}")
        return out

    def recover_and_check(self, root: str, image: FaultDisk, blob: bytes, model: Model, done: int, hi: int
                          ) -> tuple[Tree | None, list[str]]:
        raw: list[str] = []
        if self.raw_fsck:
            write_catalog(root, blob)
            c = apsw.Connection(os.path.join(root, "catalog.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
            s = dict(c.execute("SELECT key, value FROM settings"))
            c.close()
            raw = self.fsck_problems(root, image, (s["volume"], s["offset"]), raw=True)
        tree, problems, position = self.recover(root, image, blob)
        problems = raw + problems
        if tree is None:
            return None, problems
        problems += check_contract(model, tree, done, hi)
        problems += self.fsck_problems(root, image, position)
        sig = tree.sig()
        matches = [j for j in range(len(model.sigs)) if model.sigs[j] == sig and j - 1 <= hi]
        if matches:
            self.res.prefix += 1
            self.res.lag = max(self.res.lag, hi - (matches[-1] - 1))
        return tree, problems

    def kill_then_power_cut(self, root: str, sim: FaultDisk, blob: bytes, model: Model, done: int, hi: int,
                            rng: random.Random, where: str) -> None:
        """kill -9: the daemon dies, its unflushed writes stay in the page cache (still pending),
        the next mount recovers from what it reads there; then a power cut at every step of
        that recovery, or after it, and a second recovery. The contract must still hold."""
        base = sim.snapshot()
        base.root = root
        first = base.snapshot()
        first.record = True
        first.mark("catalog", blob)
        tree, problems, position = self.recover(root, first, blob, instrument=True)
        self.res.kill_points += 1
        if tree is not None:
            problems += check_contract(model, tree, done, hi)
        self.res.violations += [f"{where}, recovered in the same boot: {p}" for p in problems]
        if tree is None:
            return
        trace = first.trace
        marks = self.index_marks(trace)
        steps = {p for i, ev in enumerate(trace) if ev[0] != "mark" for p in (i, i + 1)} | {len(trace)}
        for k, s2 in FaultDisk.replayer(trace, root, base=base):
            if k not in steps:
                continue
            _, _, cblob = self.state_at(marks, k)
            for mode in ("none", "random"):
                img, _ = s2.power_cut(rng, mode)
                again, problems, pos = self.recover(root, img, cblob or blob)
                self.res.recovery_crash_points += 1
                if again is not None:
                    problems += check_contract(model, again, done, hi)
                    problems += self.fsck_problems(root, img, pos)
                step = trace[k - 1][:2] if k else "start"
                self.res.violations += [f"{where}, then a power cut at step {k}/{len(trace)} of that recovery "
                                        f"(after {step}, {mode}): {p}" for p in problems]

    def crash_during_recovery(self, root: str, base: FaultDisk, blob: bytes, expected: Tree, where: str,
                              rng: random.Random) -> None:
        """Recover base once more, recording; crash at every step of that recovery; recover again."""
        first = base.snapshot()
        first.trace = []
        first.record = True
        first.mark("catalog", blob)
        tree, problems, _ = self.recover(root, first, blob, instrument=True)
        if tree is None or tree.sig() != expected.sig():
            self.res.violations.append(f"{where}: recovery is not deterministic: {problems}")
            return
        trace = first.trace
        marks = self.index_marks(trace)
        steps = {i for i, ev in enumerate(trace) if ev[0] != "mark"}
        points = {p for i in steps for p in (i, i + 1)}
        for k, sim in FaultDisk.replayer(trace, base.root, base=base):
            if k not in points:
                continue
            _, _, cblob = self.state_at(marks, k)
            image, _ = sim.power_cut(rng, "random", root=root)
            again, problems, position = self.recover(root, image, cblob or blob)
            self.res.recovery_crash_points += 1
            if again is None:
                self.res.violations.append(f"{where}, crash {k}/{len(trace)} in recovery: {problems}")
                continue
            if again.sig() != expected.sig():
                self.res.violations.append(f"{where}, crash {k}/{len(trace)} in recovery: the second recovery "
                                           f"gives another tree ({trace[k - 1][:2] if k else 'start'})")
            for p in self.fsck_problems(root, image, position):
                self.res.violations.append(f"{where}, crash {k}/{len(trace)} in recovery: {p}")


def run_seed(args: tuple) -> Result:
    seed, n_ops, kwargs = args
    work = tempfile.mkdtemp(prefix=f"packfs-crash-{seed}-")
    try:
        return Runner(seed, n_ops, work, **kwargs).run()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarise(results: list[Result], seconds: float) -> str:
    cp = sum(r.crash_points for r in results)
    rcp = sum(r.recovery_crash_points for r in results)
    viol = [v for r in results for v in r.violations]
    lines = [
        f"crash campaign: {len(results)} seed(s), {sum(r.ops for r in results)} operations, "
        f"{sum(r.trace for r in results)} backing-disk events",
        f"crash points: {cp} power cuts during the workload + {rcp} during or after recovery = {cp + rcp} "
        f"(recoveries in the same boot after kill -9: {sum(r.kill_points for r in results)})",
        f"pending writes at the cuts: {sum(r.torn for r in results)} torn, {sum(r.dropped for r in results)} dropped",
        f"prefix states: {sum(r.prefix for r in results)}/{cp} recovered trees equal the state after some "
        f"operation (max lag {max((r.lag for r in results), default=0)} ops)",
        f"leaks: at {sum(r.leak_points for r in results)} crash points, fsck found dead records before the "
        f"checkpoint nobody will punch ({sum(r.leaks for r in results)} in all; each is a violation)",
        f"fsck of unrecovered images: {sum(r.raw_lost_commits for r in results)} showed intact, never "
        f"acknowledged commits behind a torn record (a crash inside a group commit)",
        f"violations: {len(viol)}",
        f"time: {seconds:.1f} s",
    ]
    lines += [f"  {v}" for v in viol[:50]]
    if len(viol) > 50:
        lines.append(f"  ... and {len(viol) - 50} more")
    return "\n".join(lines)


def campaign(seeds: list[int], n_ops: int, jobs: int = 1, progress: Callable[[Result, int, int], None] | None = None,
             **kwargs: Any) -> tuple[list[Result], float]:
    """Run the seeds (jobs at a time); progress(result, done, total) as each one ends."""
    t0 = time.monotonic()
    work = [(s, n_ops, kwargs) for s in seeds]
    results: list[Result] = []

    def collect(done: Iterable[Result]) -> None:
        for r in done:
            results.append(r)
            if progress is not None:
                progress(r, len(results), len(work))

    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            collect(pool.imap_unordered(run_seed, work, chunksize=1))
    else:
        collect(map(run_seed, work))
    results.sort(key=lambda r: r.seed)
    return results, time.monotonic() - t0


def _report_seed(r: Result, done: int, total: int) -> None:
    print(f"seed {r.seed}: {r.crash_points + r.recovery_crash_points} crash points, {len(r.violations)} "
          f"violation(s), {r.seconds:.0f} s ({done}/{total} seeds done)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="how many seeds")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--ops", type=int, default=250, help="operations per seed")
    p.add_argument("--random-points", type=int, default=60, help="random crash points per seed, on top of "
                   "every flush boundary")
    p.add_argument("--recovery-crashes", type=int, default=4, help="crash points per seed that also crash "
                   "during recovery")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    results, seconds = campaign(seeds, a.ops, a.jobs, progress=_report_seed, random_points=a.random_points,
                                recovery_crashes=a.recovery_crashes)
    print(summarise(results, seconds))
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
