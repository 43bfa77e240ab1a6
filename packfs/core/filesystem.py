"""The core facade: one packfs, as the FUSE adapter sees it, with no pyfuse3 in sight.

It ties the namespace, write-behind and journal together and owns the open handles.
Every method is either synchronous (served from memory) or awaits only the store.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence

import trio

from ..errors import FsError
from ..namespace import xattrblob
from ..namespace.inodes import Inode
from ..namespace.xattrstore import IN_RECORD
from ..options import Options
from ..store import records
from ..store.disk import Disk
from .journal import Journal
from .pack import Pack
from .writeback import WriteBehind

# A handle that names an inode, not an open: the FUSE adapter's for a file the kernel
# opened without a request (zero-message open, option filecache), with ROOT_WRITER set in
# a write root sent (it keeps set-ID bits). It has no release; what is written through it
# is buffered as through a counted handle, whole chunks at once and the rest with the
# next commit (an fsync of any file, or commit_interval), so a few bytes Swift appends to
# hashes.invalid in each PUT share that PUT's write instead of costing one of their own.
INODE_HANDLE = 1 << 63
ROOT_WRITER = 1 << 62
# With INODE_HANDLE: a read through a file opened O_NOATIME (the fuse shim sets it from
# the READ's flags); a counted handle opened so is in Filesystem.noatime instead.
NOATIME_READER = 1 << 60
_INODE_HANDLE_BITS = INODE_HANDLE | ROOT_WRITER | NOATIME_READER
RELATIME_NS = 24 * 3600 * 10**9  # relatime updates an atime this old even if nothing changed since
_WARMED_MAX = 64  # files whose records were prefetched lately, not asked for again
CATALOG_READERS = 4  # xattr reads from the catalog at once (noxattrs_in_memory), each in a thread
STATS_PART = 32_768  # inode slots `stats` counts per turn of the event loop
FORGET_PART = 8_192  # kernel references dropped per turn of the event loop (~1 ms)
# The xattr namespaces XFS and ext4 store (system.* holds ACLs, which packfs does not
# keep): a name they would refuse could not be copied off a packfs device to them.
XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.")
FALLOC_FL_KEEP_SIZE = 0x01  # fallocate(2)'s modes packfs serves (linux/falloc.h)
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10


@dataclass
class Setattr:
    """Which attributes a setattr changes; None leaves one alone."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime: int | None = None
    mtime: int | None = None
    ctime: int | None = None


class Filesystem:
    def __init__(self, pack: Pack, options: Options, disk: Disk | None = None) -> None:
        self.pack = pack
        self.options = options
        self.disk = disk or pack.volumes.disk
        self.ns = pack.ns
        self.volumes = pack.volumes
        self.wb = WriteBehind(self.ns, self.volumes, options.disk_chunk_size, options.max_dirty,
                              kernel_times=options.writeback_cache)
        self.journal = Journal(self.ns, self.volumes, self.wb, pack.catalog, options.checkpoint_bytes,
                               pack.recovery.metas)
        self.handles: dict[int, Inode] = {}
        self.privileged: set[int] = set()  # handles root opened: their writes keep set-ID bits
        self.noatime: set[int] = set()  # handles opened O_NOATIME: their reads leave atime alone
        self._next_fh = 1
        self._warmed: dict[int, None] = {}  # the last files prefetched, oldest first
        self._catalog_reads = trio.CapacityLimiter(CATALOG_READERS)
        self._forgets: deque[tuple[Sequence[tuple[int, int]], int]] = deque()  # FORGETs, from where not applied yet
        self._forgets_came = trio.Event()
        self.started = time.time()

    async def start(self, nursery: trio.Nursery) -> None:
        """Run the background tasks (log writer, preallocator, committer, checkpointer, xattr
        compressor and compactor); if recovery changed anything, ask for a checkpoint at
        once. It runs in the background, as every checkpoint does, so the mount serves
        while it writes the replayed changes into the catalog: on a hard disk a seek for
        each page they touch (27 s after 1,000 replayed PUTs at a million objects)."""
        nursery.start_soon(self.volumes.run)
        nursery.start_soon(self.volumes.run_preallocator)
        nursery.start_soon(self.journal.run_checkpointer)
        nursery.start_soon(self.journal.run_committer, self.options.commit_interval)
        nursery.start_soon(self.journal.run_xattr_compressor)
        nursery.start_soon(self.journal.run_xattr_compactor)
        nursery.start_soon(self._run_forgetter)
        if self.pack.recovery.changed:
            self.journal.want_checkpoint()

    async def close(self) -> None:
        """Flush everything and checkpoint, so the next mount replays nothing."""
        while self._forgets:  # so that unlinked files the kernel let go of go now
            self._forget_a_part()
        await self.journal.checkpoint()

    # -- namespace ------------------------------------------------------------------

    def lookup(self, parent: int, name: bytes) -> Inode | None:
        return self.ns.lookup(parent, name)

    def getattr(self, ino: int) -> Inode:
        return self.ns.get(ino)

    def _changeable(self) -> None:
        """Once an I/O error has broken the log the pack is read-only until remounted, as
        ext4 remounts itself read-only: a change no commit could ever hold is refused,
        not shown until the unmount drops it."""
        self.volumes.refuse_if_broken()

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int, rdev: int = 0,
               target: bytes | None = None) -> Inode:
        self._changeable()
        return self.ns.create(parent, name, mode, uid, gid, rdev, target)

    def create_unlinked(self, parent: int, mode: int, uid: int, gid: int) -> Inode:
        """A regular file with no name (open(O_TMPFILE)); link() may name it once."""
        self._changeable()
        return self.ns.create_unlinked(parent, mode, uid, gid)

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        self._changeable()
        return self.ns.link(ino, parent, name)

    def unlink(self, parent: int, name: bytes) -> None:
        self._changeable()
        self._forget_if_unused(self.ns.unlink(parent, name))

    def rmdir(self, parent: int, name: bytes) -> None:
        self._changeable()
        self._forget_if_unused(self.ns.rmdir(parent, name))

    def rename(self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int) -> None:
        self._changeable()
        replaced = self.ns.rename(old_parent, old_name, new_parent, new_name, flags)
        if replaced is not None:
            self._forget_if_unused(replaced)

    def readlink(self, ino: int) -> bytes:
        node = self.ns.get(ino)
        if node.target is None:
            raise FsError(errno.EINVAL)
        self.accessed(node)
        return node.target

    def forget(self, pairs: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped these (inode, count) references. A batch of at most a part is
        applied at once if none waits; a larger one by a background task, a part per turn
        of the event loop. When the kernel evicts many inodes (a cold walk's, after
        `drop_caches` or under memory pressure) their references come back in a stream
        of requests (150,000 inodes: 6,616 requests of up to 2,293), and applied an Inode
        view at a time they held other requests up to 205 ms. Every batch queued, the
        lists piled up and their memory stayed with the daemon (7-8 MiB after 300,000
        inodes' forgets, against 1 MiB). A count applied late only keeps an unlinked
        file a little longer."""
        if not self._forgets and len(pairs) <= FORGET_PART:
            self._apply_forgets(pairs)
            return
        self._forgets.append((pairs, 0))
        self._forgets_came.set()

    async def _run_forgetter(self) -> None:
        while True:
            await self._forgets_came.wait()
            self._forgets_came = trio.Event()
            while self._forgets:
                self._forget_a_part()
                await trio.lowlevel.checkpoint()

    def _forget_a_part(self) -> None:
        """Apply the next FORGET_PART references that came."""
        pairs, start = self._forgets[0]
        end = start + FORGET_PART
        if end < len(pairs):
            self._forgets[0] = (pairs, end)
        else:
            self._forgets.popleft()
        self._apply_forgets(pairs[start:end])

    def _apply_forgets(self, pairs: Sequence[tuple[int, int]]) -> None:
        for ino in self.ns.table.drop_lookups(pairs):
            node = self.ns.find(ino)
            if node is not None:
                self._forget_if_unused(node)

    def _forget_if_unused(self, node: Inode) -> None:
        if node.nlink == 0 and node.opens == 0 and node.lookups == 0:
            self.wb.discard(node)
            self.ns.release(node)

    async def setattr(self, ino: int, change: Setattr, privileged: bool = True) -> Inode:
        """Change attributes; privileged: the caller may keep set-ID bits (CAP_FSETID)."""
        self._changeable()
        node = self.ns.get(ino)
        now = time.time_ns()
        if change.size is not None:
            if node.is_dir:
                raise FsError(errno.EISDIR)
            if not node.is_reg:
                raise FsError(errno.EINVAL)
            self.wb.truncate(node, change.size)
        if change.mode is not None:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(change.mode)
        if change.uid is not None:
            node.uid = change.uid
        if change.gid is not None:
            node.gid = change.gid
        if change.size is not None:
            self.ns.remove_privileges(node, setid=not privileged)
        # A chown takes them even from root, and even a chown to -1:-1, which comes with no
        # attribute at all (with the writeback cache, with the kernel's ctime alone).
        chown = change.uid is not None or change.gid is not None or change == Setattr(ctime=change.ctime)
        if chown and not node.is_dir:
            self.ns.remove_privileges(node, setid=True)
        atime, mtime, ctime = node.times()
        # The kernel leaves a truncate's times to the filesystem: it cannot say whether a
        # SETATTR of the size alone is a truncate(2), an ftruncate or an O_TRUNC open, so
        # they change mtime and ctime always, as on ext4 (XFS keeps them for a truncate(2)
        # that keeps the size). With the writeback cache the kernel keeps a file's times
        # and sends them whenever they change; of its own they would differ from what
        # stat showed, once remounted.
        if not (self.wb.kernel_times and node.is_reg and change == Setattr(size=change.size)):
            if change.size is not None:
                mtime = now
            ctime = now  # even for a chown to -1:-1, which sends no attribute at all
        node.set_times(atime if change.atime is None else change.atime,
                       mtime if change.mtime is None else change.mtime,
                       ctime if change.ctime is None else change.ctime)
        self.ns.touch(node)
        return node

    # -- xattrs -------------------------------------------------------------------

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        if self.options.prefetch and ino not in self._warmed:
            self._warm(ino)
        await self._fetch_xattrs(ino)
        with _named_right_if_absent(name):
            return self.ns.getxattr(ino, name)

    async def _fetch_xattrs(self, ino: int) -> None:
        """With noxattrs_in_memory, read a file's xattrs from its record or the catalog in a
        worker thread: on a cold cache the read waits for the disk, and on the event loop
        every other request would wait behind it."""
        t = self.ns.table
        if t.xattrs_to_fetch(ino):
            epoch = t.xattr_epoch
            # A record's read is a data read (Volumes.read's threads); the catalog's share
            # a few connections.
            limiter = None if t.xref(ino) == IN_RECORD else self._catalog_reads
            x = await trio.to_thread.run_sync(t.xattr_fetcher(ino), limiter=limiter)
            t.keep_fetched(ino, x, epoch)

    def _warm(self, ino: int) -> None:
        """Start the disk read of a regular file's first records: a file whose xattrs are
        read is about to be read (Swift's GET reads five xattrs, then the data), and by
        then the records are in the page cache, so the read is served on the loop instead
        of waiting for the disk in a worker thread. Once per file among the last few."""
        node = self.ns.find(ino)
        if node is None or not node.is_reg:
            return
        self._warmed[ino] = None
        if len(self._warmed) > _WARMED_MAX:
            del self._warmed[next(iter(self._warmed))]
        self.volumes.prefetch(node.extent_list())

    async def listxattr(self, ino: int) -> list[bytes]:
        await self._fetch_xattrs(ino)
        return self.ns.listxattr(ino)

    def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.setxattrs(ino, [(name, value)])

    def setxattrs(self, ino: int, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Set xattrs in order, as one change (Namespace.setxattrs)."""
        for name, _ in items:
            _check_xattr_name(name)
        self._changeable()
        self.ns.setxattrs(ino, items)

    def fallocate(self, ino: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2): punch a hole or zero a range (a hole too), or check that the disk
        has room for length bytes; grow the file to offset + length unless KEEP_SIZE.
        Packed data has no blocks to hold for a file: a later write can still meet
        ENOSPC, as on a thin volume. (FUSE passes no other mode.) mtime and ctime change
        whatever the mode, as on ext4 and XFS; with the writeback cache the kernel sets
        them itself and sends them later, as for a write (WriteBehind.kernel_times)."""
        self._changeable()
        node = self.ns.get(ino)
        if not node.is_reg:
            raise FsError(errno.ENODEV)
        if offset < 0 or length <= 0:
            raise FsError(errno.EINVAL)
        if mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            raise FsError(errno.EOPNOTSUPP)  # collapse, insert or unshare a range
        end = offset + length
        grows = not mode & FALLOC_FL_KEEP_SIZE and end > node.size
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            self.wb.punch(node, offset, end)
        elif not self.wb.could_take(length):
            raise FsError(errno.ENOSPC)
        if grows:
            self.wb.truncate(node, end)
        if not self.wb.kernel_times:
            node.modified(time.time_ns())
        self.ns.touch(node)

    def removexattr(self, ino: int, name: bytes) -> None:
        self._changeable()
        with _named_right_if_absent(name):
            self.ns.removexattr(ino, name)

    # -- contents -------------------------------------------------------------------

    def open(self, ino: int, truncate: bool = False, privileged: bool = True, noatime: bool = False) -> int:
        """A handle for a file; privileged: the opener may keep set-ID bits when it writes
        or truncates (CAP_FSETID); noatime: opened O_NOATIME (the kernel checked the right
        to), its reads leave atime alone."""
        node = self.ns.get(ino)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if truncate and node.is_reg:
            self._changeable()
            self.wb.truncate(node, 0)
            node.modified(time.time_ns())  # an empty file's too, as on XFS and ext4
            self.ns.touch(node)
            self.ns.remove_privileges(node, setid=not privileged)
        node.opens += 1
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = node
        if privileged:
            self.privileged.add(fh)
        if noatime:
            self.noatime.add(fh)
        return fh

    def created_handle(self, ino: int, privileged: bool) -> int:
        """The handle of a file create() made while the kernel sends no release at all: once
        the kernel opens files without a request, it sends RELEASE for no file, those create()
        opened included, and a counted handle would hold its file (and its entry here) until
        the mount ends, and an unlinked file's records with it. So it names the inode, as a
        zero-message open's does (INODE_HANDLE)."""
        return INODE_HANDLE | (ROOT_WRITER if privileged else 0) | ino

    def handle_inode(self, fh: int) -> int | None:
        """The inode number a handle reads and writes, or None for no such handle."""
        node = self._handled(fh)
        return None if node is None else node.ino

    def _handle(self, fh: int) -> Inode:
        node = self._handled(fh)
        if node is None:
            raise FsError(errno.EBADF)
        return node

    def _handled(self, fh: int) -> Inode | None:
        """The file of a handle, or None: the kernel sends 0 for a file it opened with no
        OPEN (the `filecache` option's zero-message open)."""
        return self.ns.find(fh & ~_INODE_HANDLE_BITS) if fh & INODE_HANDLE \
            else self.handles.get(fh)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        node = self._handle(fh)
        if not (fh & NOATIME_READER if fh & INODE_HANDLE else fh in self.noatime):
            self.accessed(node)
        return await self.wb.read(node, offset, size)

    def accessed(self, node: Inode) -> None:
        """A read of a file, a listing of a directory or a readlink: set atime as the
        `atime` option says (Options). The kernel leaves it to packfs: it marks a FUSE
        inode S_NOATIME, and asks for the attributes again after a read that reached
        packfs. The change goes with the next commit, as any inode's: no read waits
        for the device."""
        mode = self.options.atime
        if mode == "noatime" or self.volumes.broken:
            return
        atime, mtime, ctime = node.times()
        now = time.time_ns()
        if mode == "relatime" and atime > mtime and atime > ctime and now - atime < RELATIME_NS:
            return
        node.set_times(now, mtime, ctime)
        self.ns.touch(node)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        node = self._handle(fh)
        by_inode = bool(fh & INODE_HANDLE)
        privileged = bool(fh & ROOT_WRITER) if by_inode else fh in self.privileged
        self.ns.remove_privileges(node, setid=not privileged)
        return await self.journal.reclaiming(self.wb.write, node, offset, data)

    async def release(self, fh: int) -> None:
        node = self.handles.pop(fh, None)
        self.privileged.discard(fh)
        self.noatime.discard(fh)
        if node is None:
            return
        node.opens -= 1
        if node.nlink == 0:
            self._forget_if_unused(node)
            return
        if node.wbuf is not None and node.opens == 0:
            self.wb.flush(node)  # its space was held when it was written

    async def fsync(self, alone: bool = False, fh: int | None = None) -> None:
        """Commit every change so far (fsync, fsyncdir). alone: no other request is in
        flight (see Journal.commit).

        fh: the handle of an fsync's file. One open(O_TMPFILE) made and never named commits
        nothing: no crash can leave it, and the commit that makes a name linkat gives it
        durable carries its data, as every commit appends all buffered data before its
        META (Journal._stage). A Swift PUT or DELETE then waits for one flush, not two:
        it fsyncs such a file, links it and fsyncs the directory. (A file unlinked while
        open still commits: its unlink may not be durable yet, and then its old name
        must show what this fsync saw.)
        """
        node = None if fh is None else self._handled(fh)
        if node is not None and node.ino in self.ns.linkable:
            self.volumes.refuse_if_broken()
            return
        await self.journal.commit(alone)

    # -- the whole filesystem -------------------------------------------------------

    def statfs(self) -> os.statvfs_result:
        return self.disk.statvfs(self.pack.path)

    async def stats(self) -> dict:
        """What `packfs stats` shows. The counts over every inode take a range of slots per
        turn of the event loop (~20 ms): at once they held it ~0.33 s at 600,000 inodes."""
        t = self.ns.table
        dirs = files = size = live_bytes = xattrs = in_records = 0
        held: list[int] = []
        for start in range(0, len(t.kind), STATS_PART):
            d, f, n = t.usage(start, start + STATS_PART)
            dirs, files, size = dirs + d, files + f, size + n
            xattrs += t.xattrs_in_memory(start, start + STATS_PART)
            in_records += t.xattrs_in_records(start, start + STATS_PART)
            live_bytes += sum(map(records.footprint, t.record_lengths(start, start + STATS_PART)))
            held += t.nameless(start, start + STATS_PART)
            await trio.lowlevel.checkpoint()
        live_bytes += sum(map(records.footprint, t.mapped_record_lengths()))
        v = self.volumes
        dead = self.ns.frees + self.journal.pending_metas
        allocated = sum(self.disk.allocated_bytes(v.fd(n)) for n in v.existing())
        rss = _rss_bytes()
        xattr_arena = t.xattr_arena_bytes()
        return {
            "files": files, "directories": dirs, "bytes": size, "inodes": len(self.ns),
            "volumes": len(v.existing()),
            "live_bytes": live_bytes,
            "dead_bytes": sum(records.footprint(k[2]) for k in dead),
            "punched_bytes": v.punched_bytes, "disk_allocated_bytes": allocated,
            "appended_bytes": v.appended, "device_writes": v.writes,
            "device_flushes": v.flushes, "device_flushes_on_loop": v.flushes_on_loop, "log_writer": v.writer_kind,
            "group_commit": v.group.report(),
            "swift_form_codec": xattrblob.codec(),
            "device_reads_waited": v.reads_waited, "prefetches": v.prefetches,
            "commits": self.journal.commits,
            "seconds_since_commit": round(time.monotonic() - self.journal.committed_at, 1)
            if self.journal.commits else None,
            "uncommitted_inodes": self.journal.uncommitted_inodes,
            "pending_checkpoint_inodes": self.ns.catalog_changes.inode_count,  # once per commit
            "checkpoints": self.journal.checkpoints,
            "last_checkpoint_seconds": round(self.journal.last_checkpoint_seconds, 3),
            "dirty_bytes": self.wb.dirty_bytes,
            "xattr_values_in_memory": xattrs,  # others are read from the files' records or the catalog
            "xattr_values_in_records": in_records,
            "column_bytes": t.column_bytes(),
            # Files with no name kept because an open handle or the kernel still holds them
            # (each goes at its last release or forget; a mount drops any left over).
            "unlinked_in_use": {"open": sum(1 for ino in held if t.opens.get(ino)),
                                "kernel_only": sum(1 for ino in held if not t.opens.get(ino))},
            # Times kept whole beside their column of distances from mtime, or None where
            # the column holds whole times (offsettimes.py).
            "far_times": {times.name: None if times.whole else times.far_count() for times in (t.atimes, t.ctimes)},
            # (While the xattr arena is compacted, its two copies: values moved count as free.)
            "arena_bytes": {"names": len(t.names.data), "xattrs": xattr_arena[0]},
            "arena_free_bytes": {"names": t.names.wasted(), "xattrs": xattr_arena[1]},
            "rss_bytes": rss, "rss_per_file": rss / max(1, files),
            "loaded_from": self.pack.loaded_from, "load_seconds": round(self.pack.load_seconds, 3),
            "recovery": {"replayed": self.pack.recovery.replayed, "orphans": self.pack.recovery.orphans,
                         "seconds": round(self.pack.recovery.seconds, 3)},
            "uptime_seconds": round(time.time() - self.started, 1),
            "broken": os.strerror(v.broken) if v.broken else None,
        }


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _check_xattr_name(name: bytes) -> None:
    """Refuse a name XFS and ext4 would refuse."""
    if not name.startswith(XATTR_NAMESPACES):
        raise FsError(errno.EOPNOTSUPP)
    if name in XATTR_NAMESPACES:
        raise FsError(errno.EINVAL)


@contextlib.contextmanager
def _named_right_if_absent(name: bytes) -> Iterator[None]:
    """For a get or a remove, refuse a bad name only where the file has no such xattr:
    what an older packfs let a file keep stays readable and removable."""
    try:
        yield
    except FsError as e:
        if e.errno == errno.ENODATA:
            _check_xattr_name(name)
        raise
