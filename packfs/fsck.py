"""packfs fsck: verify every record and the catalog of an unmounted pack; --repair.

The check, read-only:

1. Take the pack's lock (PACKDIR/daemon.pid), so a mounted pack is never checked or
   repaired under its daemon.
2. Scan every volume from offset 0. Records start on 4 KiB boundaries; a zero block is a
   hole (punched, or preallocated and never written) and is skipped by block. Every
   header and payload CRC is verified. Blocks that are neither zero nor a valid header
   are garbage (a torn write, a flipped bit, bytes of another pack).
3. Load the catalog and replay the journal exactly as mount does (recovery.replay), on
   a disk wrapper that keeps the replay's tail cut to itself: nothing is written.
4. Cross-check the namespace mount would serve against the scan: every extent must
   point at an intact DATA record of its own inode and length; intact DATA records no
   extent refers to are orphans (space leaks); META records before the checkpoint
   position should have been punched; directory entries, link counts, parent pointers,
   reachability and shared-record counts must agree, and every inode's xattrs must read
   back (unreadable ones are named and left as they are). Every finding names the files
   it touches by path.

Exit status: 0 clean, 1 problems found (with --repair: problems remain after repair),
2 the check could not run (pack in use, not a pack).

--repair recovers the log as mount does (cutting the uncommitted tail), then makes the
pack consistent without losing any intact fsync'd file: files whose records are damaged
move to /lost+found/#<inode> with the damaged ranges as holes and described in the
xattr user.packfs.fsck; unreachable inodes go to /lost+found too; dangling entries,
link counts and shared-record counts are fixed; then one catalog checkpoint is written
(packfs.catalog), and only after it orphans, stale journal records and damaged blocks
are punched. Each step is safe to interrupt: until the checkpoint commits, the pack is
as it was (plus the tail cut mount would make anyway); after it, only unreferenced
blocks are punched, and a second run punches whatever the first did not get to.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import apsw
from zlib_ng.zlib_ng import crc32

from . import READABLE_FORMATS, journal, records
from . import extents as ext
from . import pack as packmod
from .catalog import Catalog, CatalogError
from .disk import Disk
from .errors import FsError
from .inodes import ROOT, Inode
from .namespace import Namespace
from .recovery import PackDamaged, _batch_intact, load_namespace, read_record, replay
from .volumes import Volumes, volume_name

BLOCK = records.BLOCK
CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)
LOST_FOUND = b"lost+found"
XATTR = b"user.packfs.fsck"


@dataclass
class Finding:
    kind: str
    message: str
    problem: bool = True
    keys: list = field(default_factory=list)  # (volume, offset, footprint) blocks repair may punch
    ino: int = 0  # the inode repair must look at


@dataclass
class Report:
    packdir: str
    findings: list[Finding] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    volumes: int = 0
    data_records: int = 0
    meta_records: int = 0
    files: int = 0
    directories: int = 0
    error: str = ""  # the check could not run at all

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if not f.problem]

    def kinds(self, problems_only: bool = True) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            if f.problem or not problems_only:
                out[f.kind] += 1
        return dict(out)

    @property
    def exit_code(self) -> int:
        if self.error:
            return 2
        return 1 if self.problems else 0

    def summary(self) -> str:
        if self.error:
            return f"packfs fsck {self.packdir}: not checked: {self.error}"
        head = (f"packfs fsck {self.packdir}: {self.volumes} volume(s), "
                f"{self.data_records + self.meta_records} records ({self.data_records} data, "
                f"{self.meta_records} meta), {self.files} files, {self.directories} directories: ")
        probs = self.problems
        if not probs:
            head += "clean"
        else:
            head += f"{len(probs)} problem(s) (" + ", ".join(f"{n} {k}" for k, n in sorted(self.kinds().items())) + ")"
        if self.notes:
            head += f"; {len(self.notes)} note(s)"
        return head


# -- the scan ---------------------------------------------------------------------------

@dataclass(slots=True)
class Scanned:
    volume: int
    offset: int
    header: records.Header
    intact: bool  # payload CRC verified
    reason: str = ""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.volume, self.offset, self.header.length)

    @property
    def end(self) -> int:
        return self.offset + self.header.footprint


@dataclass
class Scan:
    records: dict[tuple[int, int], Scanned] = field(default_factory=dict)
    garbage: list[tuple[int, int, int, str]] = field(default_factory=list)  # volume, start, end, reason
    sizes: dict[int, int] = field(default_factory=dict)

    def garbage_at(self, vol: int, off: int) -> tuple[int, int, int, str] | None:
        for g in self.garbage:
            if g[0] == vol and g[1] <= off < g[2]:
                return g
        return None


class _Reader:
    """Reads a volume in large chunks."""

    def __init__(self, disk: Disk, fd: int, size: int) -> None:
        self.disk, self.fd, self.size = disk, fd, size
        self.start, self.buf = 0, b""

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset < self.start or end > self.start + len(self.buf):
            if end - offset > CHUNK:
                return self.disk.pread(self.fd, end - offset, offset)
            self.start = offset
            self.buf = self.disk.pread(self.fd, min(CHUNK, self.size - offset), offset)
        return self.buf[offset - self.start: end - self.start]

    def zeros_until(self, offset: int) -> int:
        """The end of the chunk in memory if it is all zeros from offset on, else offset."""
        rest = self.buf[offset - self.start:]
        if offset >= self.start and rest == _ZEROS[:len(rest)]:
            return self.start + len(self.buf)
        return offset


class Progress:
    """A line on stderr every few seconds while fsck works: a large pack takes minutes
    (every record is read). A check that ends sooner prints nothing."""

    def __init__(self, every: float = 2.0, write: Callable[[str], None] | None = None) -> None:
        self.every = every
        self.write = write or (lambda line: print(f"packfs fsck: {line}", file=sys.stderr, flush=True))
        self._started = time.monotonic()
        self._due = self._started + every

    def __call__(self, line: Callable[[], str]) -> None:
        """Report how far the current step is, if the last line is old enough (line is made only then)."""
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.every
            self.write(line())

    def step(self, line: str) -> None:
        """A new step begins: say so, once the whole run has taken long enough to report at all."""
        now = time.monotonic()
        if now >= self._started + self.every:
            self._due = now + self.every
            self.write(line)


QUIET = Progress(write=lambda line: None)


def scan_volumes(disk: Disk, volumes: Volumes, progress: Progress = QUIET) -> Scan:
    out = Scan()
    existing = volumes.existing()
    for n, vol in enumerate(existing, 1):
        fd = volumes.fd(vol)
        size = disk.size(fd)
        out.sizes[vol] = size
        progress.step(f"reading volume {volume_name(vol)} ({n} of {len(existing)}, {size / 2**30:.2f} GiB)")
        r = _Reader(disk, fd, size)
        pos = 0
        bad_start, bad_reason = -1, ""

        def end_bad(at: int) -> None:
            nonlocal bad_start
            if bad_start >= 0:
                out.garbage.append((vol, bad_start, at, bad_reason))
                bad_start = -1

        while pos < size:
            blk = r.read(pos, BLOCK)
            if blk == _ZEROS[:len(blk)]:
                end_bad(pos)
                pos = max(pos + BLOCK, r.zeros_until(pos))
                continue
            try:
                header = records.decode_header(blk, volumes.pack_id)
            except records.RecordError as e:
                if bad_start < 0:
                    bad_start, bad_reason = pos, str(e)
                pos += BLOCK
                continue
            end_bad(pos)
            if pos + records.HEADER_SIZE + header.length > size:
                rec = Scanned(vol, pos, header, False, "record runs past the end of the volume")
            else:
                payload = r.read(pos + records.HEADER_SIZE, header.length)
                ok = crc32(payload) == header.payload_crc
                rec = Scanned(vol, pos, header, ok, "" if ok else "payload checksum mismatch")
            out.records[(vol, pos)] = rec
            pos += header.footprint
            if not len(out.records) & 1023:
                progress(lambda: f"volume {volume_name(vol)} ({n} of {len(existing)}): {pos / 2**30:.2f} of "
                                 f"{size / 2**30:.2f} GiB read, {len(out.records):,} records checked")
        end_bad(min(pos, size))
    return out


# -- read-only replay --------------------------------------------------------------------

class _ReadOnlyDisk(Disk):
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


def _open_catalog(path: str, writable: bool) -> Catalog:
    if writable:
        return Catalog(path)
    if not os.path.exists(path):
        raise CatalogError(f"catalog {path} is missing")
    cat = Catalog.__new__(Catalog)
    try:
        cat.db = cat._reader = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        cat.settings = dict(cat.db.execute("SELECT key, value FROM settings"))
    except apsw.Error as e:
        raise CatalogError(f"catalog {path} is damaged: {e}") from e
    if cat.settings.get("format") not in READABLE_FORMATS:
        raise CatalogError(f"catalog {path} has format {cat.settings.get('format')}")
    return cat


def _dead_listed(catalog: Catalog) -> set[tuple[int, int, int]]:
    """Records the last checkpoint listed as dead (to punch, again at mount if a crash lost it)."""
    if not hasattr(catalog, "dead_records"):
        return set()
    try:
        return {tuple(r) for r in catalog.dead_records()}  # type: ignore[misc]
    except apsw.Error:
        return set()  # a catalog older than the table


def replay_tolerant(ns: Namespace, volumes: Volumes, start_vol: int, start_off: int, seq: int,
                    scan: Scan) -> tuple[tuple[int, int], list, int]:
    """Replay for repair when the log is damaged in a way a crash cannot cause.

    The end of the log is after the last META that is intact and whose write batch is
    intact; everything after it is an uncommitted tail, as at mount. Before that end, a
    damaged record is skipped instead of ending the log, and every META with an intact
    payload is applied, so commits after the damage are kept. Returns (end, metas, seq).
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
    applied = []
    for r in metas[:last + 1]:
        fd = volumes.fd(r.volume)
        _, payload = read_record(disk, fd, r.offset, pid, disk.size(fd), with_payload=True)
        journal.apply(ns, payload)  # type: ignore[arg-type]
        applied.append(r.key)
        end = (r.volume, r.end)
    return end, applied, seq


# -- paths ------------------------------------------------------------------------------

def paths_of(ns: Namespace) -> dict[int, list[str]]:
    """Every inode reachable from the root, with its paths (a few per inode)."""
    out: dict[int, list[str]] = {ROOT: ["/"]}
    stack = [(ROOT, "")]
    seen_dirs = {ROOT}
    while stack:
        ino, prefix = stack.pop()
        node = ns.find(ino)
        if node is None or not node.is_dir:
            continue
        for name, child in sorted(node.children()):
            p = prefix + "/" + name.decode("utf-8", "surrogateescape")
            lst = out.setdefault(child, [])
            if len(lst) < 4:
                lst.append(p)
            c = ns.find(child)
            if c is not None and c.is_dir and child not in seen_dirs:
                seen_dirs.add(child)
                stack.append((child, p))
    return out


def _name(paths: dict[int, list[str]], ino: int) -> str:
    p = paths.get(ino)
    if p:
        return f"{p[0]} (inode {ino})" + (f" also {', '.join(p[1:])}" if len(p) > 1 else "")
    return f"inode {ino} (no name)"


# -- the cross-check ----------------------------------------------------------------------

def cross_check(ns: Namespace, scan: Scan, checkpoint: tuple[int, int], end: tuple[int, int],
                to_free: set) -> list[Finding]:
    """Compare the namespace mount would serve with what the volumes hold."""
    found: list[Finding] = []
    paths = paths_of(ns)
    refcount: dict[tuple, int] = defaultdict(int)
    bad_inodes: dict[int, list[str]] = defaultdict(list)

    for node in ns:
        if not node.is_reg:
            continue
        top = 0
        for e in _extents(node):
            k = ext.key(e)
            refcount[k] += 1
            top = max(top, e[0] + e[1])
            what = _extent_problem(node, e, scan)
            if what:
                bad_inodes[node.ino].append(f"bytes {e[0]}-{e[0] + e[1] - 1} {what}")
            elif e[4] + e[1] > e[5]:
                bad_inodes[node.ino].append(f"bytes {e[0]}-{e[0] + e[1] - 1} lie outside their record")
        if top > node.size:
            found.append(Finding("extent-beyond-size", f"{_name(paths, node.ino)}: data mapped up to byte {top} "
                                 f"but the size is {node.size}", ino=node.ino))
    for ino, whats in sorted(bad_inodes.items()):
        found.append(Finding("corrupt-file", f"{_name(paths, ino)}: " + "; ".join(whats[:6]) +
                             (f"; and {len(whats) - 6} more" if len(whats) > 6 else ""), ino=ino))

    # Records: torn ones, orphans, stale journal records.
    for (vol, off), r in sorted(scan.records.items()):
        key = r.key
        fp = (vol, off, r.header.footprint)
        if (vol, off) >= end:
            continue  # the uncommitted tail, reported from the replay
        owner = f"inode {r.header.ino}" if r.header.rtype == records.DATA else "journal"
        if not r.intact:
            if key not in refcount:
                found.append(Finding("torn-record", f"volume {volume_name(vol)} @ {off}: torn {owner} record "
                                     f"({r.reason}){_of(paths, r)}", keys=[fp]))
            continue  # referenced ones are reported per file
        if r.header.rtype == records.DATA and key not in refcount:
            if key in to_free:
                found.append(Finding("dead-record", f"volume {volume_name(vol)} @ {off}: dead data record of "
                                     f"{owner}; the next mount punches it", problem=False))
            else:
                found.append(Finding("orphan-record", f"volume {volume_name(vol)} @ {off}: orphan data record of "
                                     f"{owner}{_of(paths, r)}, {r.header.length} bytes no file refers to",
                                     keys=[fp]))
        elif r.header.rtype == records.META and (vol, off) < checkpoint:
            if key in to_free:
                found.append(Finding("dead-record", f"volume {volume_name(vol)} @ {off}: old journal record; "
                                     "the next mount punches it", problem=False))
            else:
                found.append(Finding("stale-meta", f"volume {volume_name(vol)} @ {off}: journal record before the "
                                     "checkpoint position was never punched", keys=[fp]))
    for vol, start, stop, reason in scan.garbage:
        if (vol, start) >= end:
            continue
        stop = min(stop, end[1]) if vol == end[0] else stop
        found.append(Finding("garbage", f"volume {volume_name(vol)} @ {start}-{stop - 1}: "
                             f"{(stop - start + BLOCK - 1) // BLOCK} damaged block(s) ({reason})",
                             keys=[(vol, start, stop - start)]))

    # Shared-record counts.
    for k, n in refcount.items():
        if n > 1 and ns.refs.get(k, 1) != n:
            found.append(Finding("refcount", f"record {volume_name(k[0])} @ {k[1]}: {n} extents refer to it, "
                                 f"the catalog says {ns.refs.get(k, 1)}"))
    for k in ns.refs:
        if refcount.get(k, 0) <= 1:
            found.append(Finding("refcount", f"record {volume_name(k[0])} @ {k[1]}: shared-record count "
                                 f"{ns.refs[k]} but {refcount.get(k, 0)} extent(s) refer to it"))

    # The namespace itself.
    names: dict[int, int] = defaultdict(int)
    subdirs: dict[int, int] = defaultdict(int)
    for node in ns:
        if not node.is_dir:
            continue
        for name, child in node.children():
            c = ns.find(child)
            if c is None:
                found.append(Finding("dangling-entry", f"{_name(paths, node.ino)}: entry {name!r} names inode "
                                     f"{child}, which does not exist", ino=node.ino))
                continue
            names[child] += 1
            if c.is_dir:
                subdirs[node.ino] += 1
                if c.parent != node.ino:
                    found.append(Finding("parent", f"{_name(paths, child)}: directory's parent is {c.parent}, "
                                         f"but it is named in {node.ino}", ino=child))
    for node in ns:
        want = 2 + subdirs[node.ino] if node.is_dir else names[node.ino]
        if node.ino == ROOT:
            pass
        elif node.ino not in paths:
            found.append(Finding("unreachable", f"inode {node.ino} ({_kind(node)}, {node.nlink} link(s)) "
                                 "has no path from the root", ino=node.ino))
            continue
        elif node.is_dir and names[node.ino] > 1:
            found.append(Finding("nlink", f"{_name(paths, node.ino)}: directory has {names[node.ino]} names",
                                 ino=node.ino))
        if node.nlink != want:
            found.append(Finding("nlink", f"{_name(paths, node.ino)}: link count {node.nlink}, should be {want}",
                                 ino=node.ino))
    # Xattrs: every blob must read back (the Swift form is checked against its pickle's CRC).
    for node in ns:
        try:
            node.xattr_names()
        except FsError as e:
            found.append(Finding("unreadable-xattrs", f"{_name(paths, node.ino)}: its xattrs do not read back "
                                 f"({e.args[1]}); left as they are", ino=node.ino))
    top = ns.max_ino()
    if ns.next_ino <= top:
        found.append(Finding("next-ino", f"next inode number {ns.next_ino} is not above the largest, {top}"))
    return found


def _extents(node: Inode) -> list:
    """A file's extent map for reading (without unpacking it in place where the namespace packs it)."""
    if hasattr(node, "extent_list"):
        return node.extent_list()
    return node.extents or []


def _kind(node: Inode) -> str:
    if node.is_dir:
        return "directory"
    if node.is_reg:
        return f"file, {node.size} bytes"
    return "special file"


def _of(paths: dict[int, list[str]], r: Scanned) -> str:
    if r.header.rtype != records.DATA:
        return ""
    p = paths.get(r.header.ino)
    return f" ({p[0]})" if p else ""


def _extent_problem(node: Inode, e: ext.Extent, scan: Scan) -> str:
    vol, roff, rlen = e[2], e[3], e[5]
    r = scan.records.get((vol, roff))
    where = f"(volume {volume_name(vol)} @ {roff})"
    if r is None:
        g = scan.garbage_at(vol, roff)
        if g is not None:
            return f"point at a damaged record {where}: {g[3]}"
        if vol not in scan.sizes:
            return f"point into a missing volume {where}"
        return f"point at nothing {where}"
    if not r.intact:
        return f"point at a corrupt record {where}: {r.reason}"
    if r.header.rtype != records.DATA:
        return f"point at a journal record {where}"
    if r.header.ino != node.ino:
        return f"point at a record of inode {r.header.ino} {where}"
    if r.header.length != rlen:
        return f"point at a record of {r.header.length} bytes, not {rlen} {where}"
    return ""


# -- the command --------------------------------------------------------------------------

def fsck(packdir: str, repair: bool = False, *, disk: Disk | None = None,
         out: Callable[[str], None] | None = None, lock: bool = True) -> int:
    """`packfs fsck PACKDIR [--repair]`: print one line per finding and a summary; the exit code.
    Progress goes to stderr."""
    report = check(packdir, repair=repair, disk=disk, out=out or _print, lock=lock, progress=Progress())
    return report.exit_code


def _print(line: str) -> None:
    print(line, flush=True)


def check(packdir: str, repair: bool = False, *, disk: Disk | None = None,
          out: Callable[[str], None] | None = None, lock: bool = True, progress: Progress = QUIET) -> Report:
    """Check (and with repair=True, repair) a pack; returns the report of the final state."""
    out = out or (lambda line: None)
    packdir = os.path.abspath(packdir)
    report = Report(packdir)
    lock_fd = -1
    try:
        if lock:
            try:
                lock_fd = packmod.lock(packdir)
            except packmod.PackError:
                report.error = f"{packdir} is mounted (its daemon holds {packdir}/daemon.pid); unmount it first"
                out(report.summary())
                return report
            except OSError as e:
                report.error = f"cannot lock {packdir}: {e}"
                out(report.summary())
                return report
        disk = disk or Disk()
        try:
            return _run(packdir, repair, disk, report, out, progress)
        except OSError as e:
            report.error = f"I/O error: {e}"
            out(report.summary())
            return report
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _run(packdir: str, repair: bool, disk: Disk, report: Report, out: Callable[[str], None],
         progress: Progress) -> Report:
    first = _check(packdir, disk, report, progress)
    for f in report.findings:
        out(f.message)
    if not repair or report.error or (not report.problems and not first.tail):
        out(report.summary())
        return report
    if any(f.kind == "catalog" for f in report.findings):
        out("repair: not possible: the catalog itself is damaged or foreign")
        out(report.summary())
        return report
    _repair(packdir, disk, report, first, out, progress)
    final = Report(packdir)
    progress.step("checking the repaired pack")
    _check(packdir, disk, final, progress)
    final.actions = report.actions
    for f in final.problems:
        out(f"after repair: {f.message}")
    out(final.summary())
    return final


@dataclass
class _State:
    ns: Namespace | None = None
    scan: Scan | None = None
    catalog_pos: tuple[int, int] = (1, 0)
    end: tuple[int, int] = (1, 0)
    tail: int = 0
    tolerant: bool = False  # mount's replay would lose commits or refuse: repair replays tolerantly
    pack_id: int = 0


def _check(packdir: str, disk: Disk, report: Report, progress: Progress = QUIET) -> _State:
    st = _State()
    try:
        info = packmod.read_marker(packdir)
    except packmod.PackError as e:
        report.error = str(e)
        return st
    st.pack_id = info["pack_id"]
    try:
        catalog = _open_catalog(os.path.join(packdir, "catalog.sqlite"), writable=False)
    except CatalogError as e:
        report.findings.append(Finding("catalog", f"{e}; fsck cannot repair a damaged catalog"))
        return st
    try:
        if catalog.settings.get("pack_id") != st.pack_id:
            report.findings.append(Finding("catalog", "the catalog belongs to another pack"))
            return st
        s = catalog.settings
        st.catalog_pos = (s["volume"], s["offset"])
        voldir = os.path.join(packdir, "volumes")
        ro = _ReadOnlyDisk(disk)
        scan_vols = Volumes(disk, voldir, st.pack_id, 1 << 62, 0)
        try:
            st.scan = scan = scan_volumes(disk, scan_vols, progress)
        finally:
            scan_vols.close()
        report.volumes = len(scan.sizes)
        report.data_records = sum(1 for r in scan.records.values() if r.header.rtype == records.DATA)
        report.meta_records = len(scan.records) - report.data_records
        progress.step(f"{len(scan.records):,} records read; loading the catalog and replaying the log")
        ns = load_namespace(catalog)
        vols = Volumes(ro, voldir, st.pack_id, 1 << 62, 0)
        try:
            rec = replay(ns, vols, s["volume"], s["offset"], s["seq"])
            st.end = (vols.active, vols.tail)
            st.tail = rec.truncated_bytes
        except PackDamaged as e:
            report.findings.append(Finding("damaged-log", f"mount refuses this pack: {e}"))
            st.tolerant = True
            ns = load_namespace(catalog)
            st.end, _, _ = replay_tolerant(ns, vols, s["volume"], s["offset"], s["seq"], scan)
            _release_orphans(ns)
        finally:
            vols.close()
        st.ns = ns
        tail_records = [r for k, r in scan.records.items() if k >= st.end]
        tail_garbage = [g for g in scan.garbage if (g[0], g[1]) >= st.end]
        st.tail = len(tail_records) + len(tail_garbage)
        if st.tail:
            report.findings.append(Finding(
                "uncommitted-tail", f"volume {volume_name(st.end[0])} @ {st.end[1]}: {len(tail_records)} record(s) "
                f"and {len(tail_garbage)} damaged region(s) after the last commit (an unclean stop left them; "
                "they were never acknowledged; the next mount cuts them)", problem=False))
        lost = _commits_after(scan, st.end, vols, disk)
        if lost and not st.tolerant:
            report.findings.append(Finding(
                "lost-commits", f"volume {volume_name(st.end[0])} @ {st.end[1]}: the log ends at a damaged record, "
                f"but {lost} intact commit(s) follow it. Mount cuts them as an unacknowledged tail, which they "
                "are if a power cut hit a group commit; if not, the record was damaged later and --repair "
                "keeps them"))
            st.tolerant = True
        to_free = set(ns.frees) | _dead_listed(catalog)
        progress.step(f"cross-checking {len(ns):,} inodes against the records")
        report.findings += cross_check(ns, scan, st.catalog_pos, st.end, to_free)
        report.directories, report.files, _ = ns.table.usage()
    finally:
        catalog.close()
    return st


def _commits_after(scan: Scan, end: tuple[int, int], vols: Volumes, disk: Disk) -> int:
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


def _release_orphans(ns: Namespace) -> None:
    for ino in ns.table.nameless():
        ns.release(ns.get(ino))
    ns.catalog_changes.merge(ns.take_journal_changes())


# -- repair -------------------------------------------------------------------------------

def _repair(packdir: str, disk: Disk, report: Report, first: _State, out: Callable[[str], None],
            progress: Progress = QUIET) -> None:
    def did(line: str) -> None:
        report.actions.append(line)
        out(f"repair: {line}")

    catalog = _open_catalog(os.path.join(packdir, "catalog.sqlite"), writable=True)
    catalog.upgrade()  # what the repair writes may use this format (compressed xattrs)
    voldir = os.path.join(packdir, "volumes")
    vols = Volumes(disk, voldir, first.pack_id, 1 << 62, 0)
    try:
        s = catalog.settings
        listed = _dead_listed(catalog)
        progress.step("repairing: loading the catalog and replaying the log")
        ns = load_namespace(catalog)
        replayed: list = []
        if not first.tolerant:
            rec = replay(ns, vols, s["volume"], s["offset"], s["seq"])
            replayed = list(rec.metas)
            if rec.replayed:
                did(f"replayed {rec.replayed} commit(s) after the checkpoint, as mount does")
            if first.tail:
                did(f"cut the uncommitted tail after volume {volume_name(vols.active)} @ {vols.tail}, as mount does")
        else:
            assert first.scan is not None
            end, replayed, seq = replay_tolerant(ns, vols, s["volume"], s["offset"], s["seq"], first.scan)
            did(f"replayed {len(replayed)} intact commit(s) past damaged records; the log now ends at "
                f"volume {volume_name(end[0])} @ {end[1]}")
            for vol in [v for v in vols.existing() if v >= end[0]]:
                fd = vols.fd(vol)
                keep = end[1] if vol == end[0] else 0
                if disk.size(fd) > keep:
                    disk.truncate(fd, keep)
                    disk.fdatasync(fd)
            if first.tail:
                did(f"cut the uncommitted tail after volume {volume_name(end[0])} @ {end[1]}")
            _release_orphans(ns)
            vols.open_tail(end[0], end[1], seq)
        end = (vols.active, vols.tail)
        scan = scan_volumes(disk, vols, progress)
        progress.step("cross-checking the namespace against the records")
        findings = cross_check(ns, scan, (s["volume"], s["offset"]), end, set(ns.frees) | listed)
        punch: list[tuple[int, int, int]] = []
        lost_found: Inode | None = None

        def lost_and_found() -> Inode:
            nonlocal lost_found
            if lost_found is None:
                node = ns.lookup(ROOT, LOST_FOUND)
                if node is None or not node.is_dir:
                    name = LOST_FOUND if node is None else LOST_FOUND + b".fsck"
                    node = ns.create(ROOT, name, stat.S_IFDIR | 0o700, 0, 0)
                    did(f"created /{name.decode()}")
                lost_found = node
            return lost_found

        paths = paths_of(ns)
        moved: set[int] = set()
        for f in findings:
            if f.kind == "corrupt-file":
                node = ns.get(f.ino)
                extents = list(_extents(node))
                bad = [e for e in extents if _extent_problem(node, e, scan)]
                for e in bad:  # damaged records die with the extents; intact ones of other files stay
                    r = scan.records.get((e[2], e[3]))
                    if r is not None and not r.intact:
                        punch.append((r.volume, r.offset, r.header.footprint))
                ranges = ", ".join(f"{e[0]}-{e[0] + e[1] - 1}" for e in bad)
                for e in bad:
                    ext.punch(extents, e[0], e[0] + e[1])
                    _drop_ref(ns, ext.key(e))
                node.extents = extents
                old = paths.get(node.ino, [])
                note = f"fsck: damaged bytes {ranges} are now holes; was {', '.join(old) or 'unnamed'}".encode()
                x = dict(node.xattrs or {})
                x[XATTR] = note[:65536]
                node.xattrs = x
                _move_to_lost_found(ns, node, lost_and_found())
                moved.add(node.ino)
                ns.touch(node)
                did(f"moved {', '.join(old) or f'inode {node.ino}'} to /lost+found/#{node.ino}; "
                    f"damaged bytes {ranges} are holes now")
            elif f.kind in ("orphan-record", "stale-meta", "torn-record", "garbage"):
                punch += f.keys
            elif f.kind == "dangling-entry":
                d = ns.get(f.ino)
                for name, child in d.children():
                    if child not in ns:
                        d.del_child(name)
                        ns._touch_dirent(d.ino, name)
                        ns.touch(d)
                        did(f"removed the entry {name!r} of {_name(paths, d.ino)} (inode {child} does not exist)")
            elif f.kind == "extent-beyond-size":
                node = ns.get(f.ino)
                ns.truncate_extents(node, node.size)
                did(f"dropped the data of {_name(paths, node.ino)} beyond its size {node.size}")
        # Link counts, parents, reachability: recount from the entries.
        for f in findings:
            if f.kind == "unreachable" and f.ino in ns and f.ino not in moved:
                node = ns.get(f.ino)
                _move_to_lost_found(ns, node, lost_and_found())
                did(f"linked unreachable inode {f.ino} as /lost+found/#{f.ino}")
        _fix_links(ns, did)
        _fix_refs(ns, did)
        for f in findings:
            if f.kind == "next-ino":
                ns.next_ino = ns.max_ino() + 1
                did(f"next inode number set to {ns.next_ino}")
        # One checkpoint of everything recovery and repair changed, at the end of the log.
        ns.catalog_changes.merge(ns.take_journal_changes())
        rows, removed, dirents, refs = journal.snapshot(ns, ns.take_catalog_changes())
        position = {"volume": vols.active, "offset": vols.tail, "seq": vols.seq, "next_ino": ns.next_ino}
        # Everything to punch, as (volume, offset, bytes): dead records and damaged blocks.
        todo = sorted({(v, o, records.footprint(n)) for v, o, n in [*ns.take_frees(), *replayed, *listed]} |
                      {(v, o, -(-n // BLOCK) * BLOCK) for v, o, n in punch})
        todo = [(v, o, n) for v, o, n in todo if (v, o) < end and v in scan.sizes]
        dead = [(v, o, n - records.HEADER_SIZE) for v, o, n in todo]  # footprint(n - 48) == n
        try:
            catalog.checkpoint(rows, removed, dirents, refs, position, dead)
        except TypeError:  # a catalog without the dead-records list
            catalog.checkpoint(rows, removed, dirents, refs, position)
        did(f"wrote a catalog checkpoint at volume {volume_name(vols.active)} @ {vols.tail}")
        # Only now that nothing refers to them: punch dead records and damaged blocks.
        touched = set()
        for v, o, n in todo:
            n = min(n, scan.sizes[v] - o)
            if n <= 0:
                continue
            disk.punch_hole(vols.fd(v), o, -(-n // BLOCK) * BLOCK)
            touched.add(v)
        for v in sorted(touched):
            disk.fdatasync(vols.fd(v))
        if punch:
            did(f"punched {len(punch)} orphan, stale or damaged region(s)")
    finally:
        vols.close()
        catalog.close()


def _drop_ref(ns: Namespace, key: tuple) -> None:
    """An extent of a damaged record is gone; fix the shared-record count, never free it (it is damaged)."""
    if key in ns.refs:
        n = ns.refs[key] - 1
        ns.set_ref(key, n)
        ns.journal_changes.refs.add(key)


def _move_to_lost_found(ns: Namespace, node: Inode, lf: Inode) -> None:
    """Take every name of node away and link it as lost+found/#ino."""
    for d in list(ns):
        if not d.is_dir:
            continue
        for name, child in d.children():
            if child == node.ino:
                d.del_child(name)
                ns._touch_dirent(d.ino, name)
                ns.touch(d)
    name = f"#{node.ino}".encode()
    lf.set_child(name, node.ino)
    ns._touch_dirent(lf.ino, name)
    ns.touch(lf)
    if node.is_dir:
        node.parent = lf.ino
    node.nlink = 2 if node.is_dir else 1
    ns.touch(node)


def _fix_links(ns: Namespace, did: Callable[[str], None]) -> None:
    names: dict[int, int] = defaultdict(int)
    subdirs: dict[int, int] = defaultdict(int)
    for d in ns:
        for name, child in d.children():
            names[child] += 1
            c = ns.find(child)
            if c is not None and c.is_dir:
                subdirs[d.ino] += 1
                if c.parent != d.ino:
                    c.parent = d.ino
                    ns.touch(c)
                    did(f"parent of directory inode {child} set to {d.ino}")
    for node in list(ns):
        want = 2 + subdirs[node.ino] if node.is_dir else names[node.ino]
        if node.ino != ROOT and names[node.ino] == 0:
            continue  # unreachable: handled by the caller
        if node.nlink != want:
            did(f"link count of inode {node.ino} set from {node.nlink} to {want}")
            node.nlink = want
            ns.touch(node)


def _fix_refs(ns: Namespace, did: Callable[[str], None]) -> None:
    count: dict[tuple, int] = defaultdict(int)
    for node in ns:
        for e in _extents(node) if node.is_reg else ():
            count[ext.key(e)] += 1
    for k in set(ns.refs) | {k for k, n in count.items() if n > 1}:
        want = count.get(k, 0)
        if ns.refs.get(k, 1) != max(want, 1) and (want > 1 or k in ns.refs):
            did(f"shared-record count of {volume_name(k[0])} @ {k[1]} set to {want}")
            ns.set_ref(k, want)
            ns.journal_changes.refs.add(k)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - the CLI calls fsck()
    import argparse
    p = argparse.ArgumentParser(prog="packfs fsck")
    p.add_argument("packdir")
    p.add_argument("--repair", action="store_true")
    a = p.parse_args(argv)
    return fsck(a.packdir, repair=a.repair)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
