"""Mount-time load and replay, and the scan fsck builds on.

Load: the catalog's last checkpoint, then every META record after the checkpoint's log
position, in log order. A META is applied only if it is intact and every record of the
write batch it closed is intact too (its header's offset field says where that batch
began), because a power cut may keep any subset of unflushed writes. The first record
that fails ends the log: everything after it was never acknowledged, and is cut off
so the next append starts on a clean tail. Replay reads the volumes and writes nothing
but that cut, so a crash during recovery only means running it again.
"""
from __future__ import annotations

import logging
import marshal
import time
from dataclasses import dataclass, field

from ..namespace.inodes import InodeTable
from ..namespace.namespace import Namespace
from ..store import records
from ..store.disk import Disk
from ..store.volumes import Volumes
from . import journal
from .catalog import Catalog

log = logging.getLogger(__name__)


class PackDamaged(Exception):
    """The log is damaged in a way a crash cannot cause; fsck must look at it."""


@dataclass
class Recovery:
    replayed: int = 0
    orphans: int = 0
    truncated_bytes: int = 0
    seconds: float = 0.0
    metas: list = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.replayed or self.orphans)


def load_namespace(catalog: Catalog, xattrs_in_memory: bool = True, table: InodeTable | None = None) -> Namespace:
    """The catalog's namespace; with xattrs_in_memory off, xattr values stay in the catalog.

    `table` is the catalog's inode table read from its namespace image (image.py), if
    one was; then only the small tables are read from the catalog.
    """
    ns = Namespace()
    if table is None:
        ns.table.keep_xattrs = xattrs_in_memory
        ns.table.load_all(catalog.inode_rows(xattrs_in_memory), catalog.top_ino() + 1)
        ns.table.load_entries(catalog.dirents())
    else:
        ns.table = table
    ns.table.fetch_xattrs = catalog.xattrs_of
    for vol, off, length, count in catalog.shared_records():
        ns.refs[(vol, off, length)] = count
    ns.next_ino = max(ns.next_ino, catalog.settings["next_ino"])
    ns.loaded()
    return ns


def read_record(disk: Disk, fd: int, offset: int, pack_id: int, size: int,
                with_payload: bool) -> tuple[records.Header, bytes | None]:
    """The record at offset; RecordError if there is none intact."""
    if offset + records.HEADER_SIZE > size:
        raise records.RecordError("end of volume")
    head = disk.pread(fd, records.HEADER_SIZE, offset)
    header = records.decode_header(head, pack_id)
    if offset + header.footprint > size:
        raise records.RecordError("record runs past the end of the volume")
    if not with_payload:
        return header, None
    payload = disk.pread(fd, header.length, offset + records.HEADER_SIZE)
    records.check_payload(header, payload)
    return header, payload


def _batch_intact(disk: Disk, fd: int, start: int, end: int, pack_id: int, size: int) -> bool:
    pos = start
    while pos < end:
        try:
            header, _ = read_record(disk, fd, pos, pack_id, size, with_payload=True)
        except records.RecordError:
            return False
        pos += header.footprint
    return pos == end


def _hole(disk: Disk, fd: int, pos: int, size: int) -> bool:
    """True if the log in this volume ends cleanly at pos: its end, or a block never written."""
    if pos + records.HEADER_SIZE > size:
        return True
    block = disk.pread(fd, min(records.BLOCK, size - pos), pos)
    return block == bytes(len(block))


def _record_keys(node: object) -> set:
    extents = node.extent_list() if hasattr(node, "extent_list") else node.extents  # type: ignore[attr-defined]
    return {(e[2], e[3], e[5]) for e in extents or ()}


def _damaged(vol: int, pos: int) -> str:
    return (f"volume {vol} is damaged at offset {pos}, and commits acknowledged after it follow; "
            "mount would lose them: run packfs fsck --repair")


def _acknowledged_after(volumes: Volumes, vol: int, pos: int) -> bool:
    """True if an intact commit past (vol, pos) says the log there had been flushed.

    Then what stopped the log at (vol, pos) is damage, not the torn tail of a crash,
    and cutting the log there would drop acknowledged commits.
    """
    disk, fd = volumes.disk, volumes.fd(vol)
    size = disk.size(fd)
    chunk = 1 << 20
    start = pos + records.BLOCK
    for base in range(start, size, chunk):
        buf = disk.pread(fd, min(chunk, size - base), base)
        for at in range(0, len(buf) - records.HEADER_SIZE + 1, records.BLOCK):
            try:
                header = records.decode_header(buf[at:at + records.HEADER_SIZE], volumes.pack_id)
                if header.rtype != records.META:
                    continue
                _, payload = read_record(disk, fd, base + at, volumes.pack_id, size, with_payload=True)
            except records.RecordError:
                continue
            if journal.durable_position(payload) > (vol, pos):  # type: ignore[arg-type]
                return True
    return False


def replay(ns: Namespace, volumes: Volumes, start_vol: int, start_off: int, seq: int) -> Recovery:
    """Apply the intact journal after (start_vol, start_off); cut the log after it."""
    began = time.monotonic()
    disk, pack_id = volumes.disk, volumes.pack_id
    rec = Recovery()
    end_vol, end_off = start_vol, start_off
    stopped = False
    clean = True  # the log stopped at the clean end of a volume, not at a damaged record
    # Records that may have died since the checkpoint: the replayed DATA records, and the
    # records of every inode a commit rewrote, as the checkpoint had them. (owner ino, key, position)
    candidates: list[tuple[int, tuple[int, int, int], tuple[int, int]]] = []
    seen: set[int] = set()
    stop: tuple[int, int] | None = None  # where the log last stopped (a hole or damage)
    for vol in [v for v in volumes.existing() if v >= start_vol]:
        fd = volumes.fd(vol)
        size = disk.size(fd)
        pos = start_off if vol == start_vol else 0
        if stopped:
            try:
                read_record(disk, fd, 0, pack_id, size, with_payload=False)
            except records.RecordError:
                clean = False  # an empty volume: nothing may follow it
                continue
            if not clean:
                raise PackDamaged(f"volume {vol} has records after a damaged end of volume {end_vol}; "
                                  "run packfs fsck")
            # The previous volume ended cleanly and this one starts with a record: the log
            # rolled over, which it does only after flushing the previous volume.
            if stop is not None and _acknowledged_after(volumes, *stop):
                raise PackDamaged(_damaged(*stop))
            stopped, stop = False, None
        while True:
            try:
                header, payload = read_record(disk, fd, pos, pack_id, size, with_payload=False)
                if header.rtype == records.META:
                    header, payload = read_record(disk, fd, pos, pack_id, size, with_payload=True)
                    if not _batch_intact(disk, fd, header.offset, pos, pack_id, size):
                        raise records.RecordError("the write batch of this commit is torn")
                    rows, removed = marshal.loads(payload)[:2]  # type: ignore[arg-type]
                    for ino in [r[0] for r in rows] + list(removed):
                        old = ns.find(ino)
                        if ino not in seen and old is not None:
                            candidates += [(ino, k, (0, 0)) for k in _record_keys(old)]
                        seen.add(ino)
                    try:
                        journal.apply(ns, payload)  # type: ignore[arg-type]
                    except ValueError as e:  # a row that edits a map the namespace lacks
                        raise PackDamaged(f"the commit at volume {vol} @ {pos} does not apply: {e}; "
                                          "run packfs fsck") from None
                    rec.replayed += 1
                    rec.metas.append((vol, pos, header.length))
                    end_vol, end_off = vol, pos + header.footprint
                else:
                    candidates.append((header.ino, (vol, pos, header.length), (vol, pos)))
            except records.RecordError:
                stopped = True
                stop = (vol, pos)
                clean = _hole(disk, fd, pos, size)
                break
            seq = max(seq, header.seq + 1)
            pos += header.footprint
    if stop is not None and _acknowledged_after(volumes, *stop):
        raise PackDamaged(_damaged(*stop))
    # Cut off what follows the last intact commit: it was never acknowledged.
    flushed = set()
    for vol in [v for v in volumes.existing() if v >= end_vol]:
        fd = volumes.fd(vol)
        keep = end_off if vol == end_vol else 0
        size = disk.size(fd)
        if size > keep:
            rec.truncated_bytes += size - keep
            disk.truncate(fd, keep)
            disk.fdatasync(fd)
            flushed.add(vol)
    # What was replayed may have been read from the page cache only (the daemon was
    # killed before its flush, and this mount is in the same boot): make it durable
    # before the post-recovery checkpoint names it.
    for vol in [v for v in volumes.existing() if start_vol <= v <= end_vol and v not in flushed]:
        disk.fdatasync(volumes.fd(vol))
    for ino in ns.table.nameless():
        ns.release(ns.get(ino))
        rec.orphans += 1
    # Records that died after the checkpoint were only in the lost process's list of
    # frees: find them again, so the post-recovery checkpoint punches them.
    freed = set(ns.frees)
    live: dict[int, set] = {}
    for owner, key, at in candidates:
        if at >= (end_vol, end_off) or key in freed:
            continue  # cut with the tail, or freed already
        node = ns.find(owner)
        if node is not None and owner not in live:
            live[owner] = _record_keys(node)
        if node is None or key not in live[owner]:
            ns.frees.append(key)
            freed.add(key)
    ns.take_journal_changes()  # into the catalog's pending changes
    volumes.open_tail(end_vol, end_off, seq)
    rec.seconds = time.monotonic() - began
    return rec
