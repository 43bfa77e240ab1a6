"""Replaying the log as mount does, without writing: a read-only disk and catalog; and
the tolerant replay repair uses when the log is damaged in a way a crash cannot cause."""
from __future__ import annotations

import errno
import os

import apsw

from ..core import journal
from ..core.catalog import Catalog, CatalogError
from ..core.recovery import _batch_intact, read_record
from ..namespace.namespace import Namespace
from ..store import records
from ..store.disk import Disk
from ..store.volumes import Volumes
from .scan import Scan


class ReadOnlyDisk(Disk):
    """Reads through to a disk; keeps writes (the replay's tail cut) to itself."""

    def __init__(self, inner: Disk) -> None:
        self.inner = inner
        self._fake: dict[int, str] = {}
        self._sizes: dict[int, int] = {}

    def open(self, path: str, create: bool = False) -> int:
        try:
            return self.inner.open(path, create=False)
        except FileNotFoundError:
            if not create:
                raise
            fd = -1 - len(self._fake)
            self._fake[fd] = path
            return fd

    def close(self, fd: int) -> None:
        if fd >= 0:
            self.inner.close(fd)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        if fd < 0:
            return b""
        return self.inner.pread(fd, max(0, min(length, self.size(fd) - offset)), offset)

    def size(self, fd: int) -> int:
        if fd in self._sizes:
            return self._sizes[fd]
        return 0 if fd < 0 else self.inner.size(fd)

    def truncate(self, fd: int, size: int) -> None:
        self._sizes[fd] = size

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        raise OSError(errno.EROFS, "fsck without --repair writes nothing")

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass

    def punch_hole(self, fd: int, offset: int, length: int) -> None:
        pass

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        pass

    def allocated_bytes(self, fd: int) -> int:
        return 0 if fd < 0 else self.inner.allocated_bytes(fd)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def statvfs(self, path: str) -> os.statvfs_result:
        return self.inner.statvfs(path)


def open_catalog(path: str, writable: bool) -> Catalog:
    if writable:
        return Catalog(path)
    if not os.path.exists(path):
        raise CatalogError(f"catalog {path} is missing")
    return Catalog(path, readonly=True)


def dead_listed(catalog: Catalog) -> set[tuple[int, int, int]]:
    """Records the last checkpoint listed as dead (to punch, again at mount if a crash lost it)."""
    try:
        return {tuple(r) for r in catalog.dead_records()}  # type: ignore[misc]
    except apsw.Error:
        return set()  # a catalog older than the table


def replay_tolerant(ns: Namespace, volumes: Volumes, start_vol: int, start_off: int, seq: int,
                    scan: Scan) -> tuple[tuple[int, int], list, int, set[int]]:
    """Replay for repair when the log is damaged in a way a crash cannot cause.

    The end of the log is after the last META that is intact and whose write batch is
    intact; everything after it is an uncommitted tail, as at mount. Before that end, a
    damaged record is skipped instead of ending the log, and every META with an intact
    payload is applied, so commits after the damage are kept. A META after a damaged
    record may log a file's map as its edits since a commit that the damage took: the
    ranges that commit changed then show older contents. Returns (end, metas, seq, the
    inodes of such maps).
    """
    disk, pid = volumes.disk, volumes.pack_id
    metas = []
    for (vol, off), r in sorted(scan.records.items()):
        if (vol, off) < (start_vol, start_off):
            continue
        seq = max(seq, r.header.seq + 1)
        if r.header.rtype == records.META and r.intact:
            metas.append(r)
    end = (start_vol, start_off)
    last = -1
    for i, r in enumerate(metas):
        fd = volumes.fd(r.volume)
        if _batch_intact(disk, fd, r.header.offset, r.offset, pid, disk.size(fd)):
            last = i
    damaged = min((k for k, r in scan.records.items() if k >= (start_vol, start_off) and not r.intact),
                  default=None)
    applied = []
    stale: set[int] = set()
    for r in metas[:last + 1]:
        fd = volumes.fd(r.volume)
        _, payload = read_record(disk, fd, r.offset, pid, disk.size(fd), with_payload=True)
        if damaged is not None and (r.volume, r.offset) > damaged:
            stale.update(journal.edited_maps(payload))  # type: ignore[arg-type]
        journal.apply(ns, payload, strict=False)  # type: ignore[arg-type]
        applied.append(r.key)
        end = (r.volume, r.end)
    return end, applied, seq, stale


def commits_after(scan: Scan, end: tuple[int, int], vols: Volumes, disk: Disk) -> int:
    """Intact METAs with intact write batches after the end of the log."""
    n = 0
    for (vol, off), r in sorted(scan.records.items()):
        if (vol, off) < end or r.header.rtype != records.META or not r.intact:
            continue
        fd = disk.open(vols.path(vol))
        try:
            if _batch_intact(disk, fd, r.header.offset, off, vols.pack_id, disk.size(fd)):
                n += 1
        finally:
            disk.close(fd)
    return n


def release_orphans(ns: Namespace) -> None:
    for ino in ns.table.nameless():
        ns.release(ns.get(ino))
    ns.take_journal_changes()  # into the catalog's pending changes
