"""The inode table: every inode's attributes in typed columns indexed by inode number.

A Swift object is three inodes (suffix directory, hash directory, .data file), and a
million objects are three million inodes. As Python objects they cost about 600 B each
(the object, its boxed integers, a dict slot); as a slot in these columns they cost
31 B. Names and xattr values are strings in arenas (arena.py), referred to from
columns. Rare or variable-sized fields (device numbers, symlink targets, extent maps,
entries of directories with several names) live in dicts keyed by inode number.
Where xattr values are, and how they are kept small, is xattrstore.py's: a part of the
table, kept apart.

`Inode` is a view of one slot: made on demand, two pointers big, never stored here.
Inode numbers are reused (last freed, first reused), so the columns stay as long as the
largest number of inodes ever live at once, not as the number ever created.
"""
from __future__ import annotations

import itertools
import logging
import operator
import stat
from array import array
from typing import Any, Iterable, Iterator

from ..store import extents as ext
from . import xattrstore
from .arena import CountedArena
from .dirents import PACKED_MAX, PackedEntries, name_of, pack_small, small_get, small_items, stored_name
from .inoderow import InodeRow
from .offsettimes import FAR, OffsetTimes
from .xattrblob import iter_xattrs, pack_xattrs, unpack_xattrs
from .xattrstore import IN_CATALOG, IN_RECORD, IN_RECORD_ROW, XattrStore

log = logging.getLogger(__name__)

ROOT = 1

# Each column's array typecode. Inode numbers (kid, a parent) are below INO_MAX, so u32.
# A slot is 30 B. `kid` and `kname` hold a directory's one entry. In anything else,
# `kname` holds a regular file's one whole record (as `rec`; its length is the file's
# size) and `kid` the inode's xattrs (as `xat`: a CountedArena reference, or
# IN_CATALOG or IN_RECORD; a directory's are in the `dir_xat` dict). No inode needs both, so they
# share the columns. `kname` is u32 until a value needs more (see set_kname), and `kid`
# until an xattr reference does (past 32 GiB of xattr values). `kind`
# numbers a (mode, uid, gid, nlink) kind in `kinds`: a disk's inodes have a few dozen
# (Swift's: its files, its temporary files, and its directories with each link count
# their subdirectories give them: 2 for a hash directory, 3 or a few more for a suffix
# directory, the top for a partition directory; of one owner); kind 0 is a free slot.
# It is u8 until a table has more than 256 kinds, then u16, then u32 past KINDS_NARROW
# kinds. A kind's link count is at most NLINK_TOP, which means the inode's is in
# `wide_nlink`: a directory that grows through every count on the way to its top makes
# a kind of each (a Swift partition directory does), so the top is low enough for a few
# owners' directories to fit in u8 (at 255, Swift's directories of one owner and the
# root's took 258 kinds: a Swift-like tree built without FUSE).
# `size` is narrower than its values may be (see NARROW_TOPS); `lookups` is u8 until a
# count passes 255, then wider (see set_lookups).
# `atime` and `ctime` hold distances from `mtime` where they fit (offsettimes.py).
# `size` holds a directory's parent (as `parent`): a directory's size is 0, and only a
# directory keeps its parent (for ..), so no inode needs both.
COLUMNS = {"kind": "B", "kid": "I",
           "lookups": "B", "size": "I", "atime": "I", "mtime": "q", "ctime": "I", "kname": "I"}
# A value at or past its narrow column's top is kept in the table's `wide_<column>` dict,
# and the column holds the top: files of 4 GiB or more. So are link counts of NLINK_TOP
# or more (`wide_nlink`): directories with more than 61 subdirectories (a Swift
# partition directory with its suffix directories, the objects directory: ~1 in 2,800
# of the inodes of a million Swift objects). An entry (~100 B) costs at most 1.6 B
# more for each of those subdirectories.
NARROW_TOPS = {"size": 0xFFFFFFFF}
_SIZE_TOP = NARROW_TOPS["size"]
NLINK_TOP = 64  # a kind's link count at or past this is the inode's in `wide_nlink`
_KNAME_TOP = 0xFFFFFFFF  # `kname` is u32 until a record or a name reference needs more (see set_kname)
RUNTIME_COLUMNS = ("lookups",)  # what only a running mount has: never saved
KINDS_NARROW = 1 << 16
INO_MAX = (1 << 32) - 1  # inode numbers stay below this (numbers are reused, so it bounds live inodes)
SMALL = INO_MAX  # `kid` of a directory whose entries are one string in the names arena
_IFMT = 0o170000  # the file type bits of a mode
_IFDIR, _IFREG = stat.S_IFDIR, stat.S_IFREG
_REC_PAGE_BITS = 20  # rec = volume index << 20 | record offset / 4 KiB (see InodeTable.volumes)
_REC_PAGE_MASK = (1 << _REC_PAGE_BITS) - 1
VOLUME_INDEXES = 1 << 12  # volume indexes a u32 `rec` holds: 16 TiB of 4 GiB volumes


class InodeTable(XattrStore):
    """The columns, and the directory entries.

    A slot is free when its mode is 0. A directory's entries are kept in one of four
    forms: most of Swift's suffix and hash directories hold one name, stored in the
    directory's own slot (`kid` is the child, `kname` its name, a reference into the
    `names` arena); a directory with a few names keeps them in its slot too, as one
    string in the arena (`kid` is SMALL, `kname` names a dirents.pack_small string); a
    directory with more has an entry in `dirs` instead (`kid` is then 0): packed
    (dirents.PackedEntries: Swift's partition directories), or a dict once its names
    pass dirents.PACKED_MAX bytes.
    """

    def __init__(self) -> None:
        self.kind = array(COLUMNS["kind"])
        self.kinds: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # (mode, uid, gid, nlink) by number; never shrinks
        self.modes = [0]  # each kind's mode, for the many reads of one
        self.links = [0]  # and its link count
        self._kind_numbers = {(0, 0, 0, 0): 0}
        self.size = array(COLUMNS["size"])
        self.mtime = array(COLUMNS["mtime"])
        self.atimes = OffsetTimes("atime", after=False, mtimes=lambda: self.mtime)
        self.ctimes = OffsetTimes("ctime", after=True, mtimes=lambda: self.mtime)
        self.kid = array(COLUMNS["kid"])
        self.kname = array(COLUMNS["kname"])
        self.names = CountedArena(1)
        self.dirs: dict[int, PackedEntries | dict[bytes, int]] = {}
        self.rdev: dict[int, int] = {}
        self.target: dict[int, bytes] = {}
        self._init_xattrs()
        # Extent maps of regular files; absent means empty. A file whose map is one whole
        # record exactly as long as the file (most Swift objects smaller than
        # disk_chunk_size) has it in the `rec` column instead (`kname`: no memory of its
        # own; the record's length is the file's size); others have it here, packed up to
        # ext.PACKED_MAX extents, a list beyond (cheap to edit in place).
        self.extents: dict[int, bytes | list[ext.Extent]] = {}
        # A whole record names its volume by an index here, so that `rec` is a u32 however
        # many volumes a disk has written (numbers only grow): the indexes of volumes no
        # record uses any more are reused when the u32 would run out (renumber_volumes).
        self.volumes = array("I", [0])  # index -> volume number; index 0 is never used
        self.volume_index: dict[int, int] = {}
        self.renumber_at = VOLUME_INDEXES
        # What only a running mount has: the kernel's references (FUSE lookup counts: a
        # column, because a walk makes the kernel hold every inode), open handles and
        # write buffers (dicts: few inodes have them).
        self.lookups = array(COLUMNS["lookups"])
        self.wide_nlink: dict[int, int] = {}
        self.wide_size: dict[int, int] = {}
        self.opens: dict[int, int] = {}
        self.wbuf: dict[int, Any] = {}
        self.free = array("q")  # free slots below the highest ever used, reused last first
        self.live = 0
        self.grow(ROOT + 1)

    def __len__(self) -> int:
        return self.live

    @property
    def parent(self) -> array:
        """A directory's parent (for ..): `size` (see COLUMNS)."""
        return self.size

    atime = property(lambda self: self.atimes.column, lambda self, column: setattr(self.atimes, "column", column),
                     doc="The `atime` column (see offsettimes.py).")
    ctime = property(lambda self: self.ctimes.column, lambda self, column: setattr(self.ctimes, "column", column),
                     doc="The `ctime` column (see offsettimes.py).")

    @property
    def rec(self) -> array:
        """A regular file's one whole record (see _rec), 0 if its map is elsewhere: `kname`."""
        return self.kname

    def kind_of(self, mode: int, uid: int, gid: int, nlink: int) -> int:
        """The number of a (mode, uid, gid, nlink) kind, new if it has none yet (nlink
        below NLINK_TOP, or that top; the `kind` column widens when it needs to: store
        the number after this returns)."""
        key = (mode, uid, gid, nlink)
        n = self._kind_numbers.get(key)
        if n is None:
            assert mode, "mode 0 is a free slot's"
            assert 0 <= nlink <= NLINK_TOP, "a link count past the top is in wide_nlink"
            n = self._kind_numbers[key] = len(self.kinds)
            self.kinds.append(key)
            self.modes.append(mode)
            self.links.append(nlink)
            wide = "B" if n < 256 else "H" if n < KINDS_NARROW else "I"
            if self.kind.typecode != wide:
                self.kind = array(wide, self.kind)
        return n

    def set_kinds(self, kinds: list[tuple[int, int, int, int]]) -> None:
        """The kinds the `kind` column numbers (a loaded image's)."""
        kinds = [(mode, uid, gid, nlink) for mode, uid, gid, nlink in kinds]
        if not kinds or kinds[0] != (0, 0, 0, 0) or 0 in [k[0] for k in kinds[1:]] or len(set(kinds)) != len(kinds) \
                or not all(0 <= k[3] <= NLINK_TOP for k in kinds):
            raise ValueError("kind 0 is not a free slot's, a kind is not one of a kind, or a link count is out of range")
        self.kinds = kinds
        self.modes = [k[0] for k in kinds]
        self.links = [k[3] for k in kinds]
        self._kind_numbers = {k: n for n, k in enumerate(kinds)}

    def _set_kind(self, ino: int, mode: int, uid: int, gid: int, nlink: int) -> None:
        """Give an inode the kind of these values (a link count past the kinds' top goes
        to `wide_nlink`)."""
        if nlink >= NLINK_TOP:
            self.wide_nlink[ino] = nlink
            nlink = NLINK_TOP
        elif self.links[self.kind[ino]] == NLINK_TOP:
            del self.wide_nlink[ino]
        n = self.kind_of(mode, uid, gid, nlink)
        self.kind[ino] = n

    def mode_of(self, ino: int) -> int:
        return self.modes[self.kind[ino]]

    def set_mode(self, ino: int, mode: int) -> None:
        """A chmod: the inode takes the kind of its new mode."""
        _, uid, gid, nlink = self.kinds[self.kind[ino]]
        n = self.kind_of(mode, uid, gid, nlink)
        self.kind[ino] = n

    def set_owner(self, ino: int, uid: int, gid: int) -> None:
        """A chown: the inode takes the kind of its new owner."""
        mode, _, _, nlink = self.kinds[self.kind[ino]]
        n = self.kind_of(mode, uid, gid, nlink)
        self.kind[ino] = n

    def nlink_of(self, ino: int) -> int:
        n = self.links[self.kind[ino]]
        return self.wide_nlink[ino] if n == NLINK_TOP else n

    def set_nlink(self, ino: int, value: int) -> None:
        """A link or an unlink: the inode takes the kind of its new link count."""
        mode, uid, gid, _ = self.kinds[self.kind[ino]]
        self._set_kind(ino, mode, uid, gid, value)

    def of_type(self, fmt: int, start: int = 0, stop: int | None = None) -> bytes:
        """1 for each slot in [start, stop) whose file type is fmt (stat.S_IFDIR, ...), else 0."""
        return self._of_kinds(bytes([m & _IFMT == fmt for m in self.modes]), start, stop)

    def not_dirs(self, start: int = 0, stop: int | None = None) -> bytes:
        """1 for each live slot in [start, stop) that is not a directory's (whose `kid` is its `xat`)."""
        return self._of_kinds(bytes([m != 0 and m & _IFMT != _IFDIR for m in self.modes]), start, stop)

    def _of_kinds(self, flags: bytes, start: int, stop: int | None) -> bytes:
        """flags[kind] for each slot in [start, stop)."""
        kind = self.kind if stop is None and not start else self.kind[start:stop]
        if kind.typecode == "B":
            return kind.tobytes().translate(flags.ljust(256, b"\0"))
        return bytes(map(flags.__getitem__, kind))

    def grow(self, slots: int) -> None:
        """Make room for inode numbers below slots (and then some: growth is geometric)."""
        have = len(self.kind)
        if slots <= have:
            return
        more = max(slots, have + have // 4 + 1024) - have
        for name in COLUMNS:
            column = getattr(self, name)
            column.frombytes(bytes(column.itemsize * more))

    def column_bytes(self) -> int:
        """Bytes the columns hold (every slot, free and headroom too, and the far times
        beside the time columns): what `stats` shows."""
        return sum(getattr(self, name).itemsize * len(getattr(self, name))
                   for name in COLUMNS if name not in ("atime", "ctime")) + \
            self.atimes.nbytes() + self.ctimes.nbytes()

    def get_narrow(self, name: str, ino: int) -> int:
        """A narrow column's value (see NARROW_TOPS)."""
        value = getattr(self, name)[ino]
        return getattr(self, "wide_" + name)[ino] if value == NARROW_TOPS[name] else value

    def set_narrow(self, name: str, ino: int, value: int) -> None:
        """Set a narrow column's value: the column's top and a `wide_` entry if it does not fit."""
        column, top = getattr(self, name), NARROW_TOPS[name]
        if value >= top:
            getattr(self, "wide_" + name)[ino] = value
            column[ino] = top
        else:
            if column[ino] == top:
                del getattr(self, "wide_" + name)[ino]
            column[ino] = value

    def set_size(self, ino: int, value: int) -> None:
        """A file's new size. A whole record in `rec` is as long as its file: when the
        size moves away from it, the map moves to `extents`; and a map of one extent
        comes back once the file is as long as it (a truncate to its end)."""
        if self.modes[self.kind[ino]] & _IFMT != _IFREG:
            self.set_narrow("size", ino, value)
            return
        old = self.size[ino]  # (a whole record's file is below the column's top)
        if self.kname[ino] and value != old:
            self._leave_record(ino)
            self.extents[ino] = ext.pack(self.extent_list(ino))  # type: ignore[assignment]
            self.kname[ino] = 0
        self.set_narrow("size", ino, value)
        e = self.extents.get(ino)
        if type(e) is bytes and len(e) == ext.PACKED.size and ext.PACKED.unpack(e)[1] == value:
            self.set_extents(ino, [ext.PACKED.unpack(e)])

    def set_lookups(self, ino: int, value: int) -> None:
        """Set the kernel's reference count of an inode. The column is u8 until a count
        needs more, then u16, then u32, for the rest of the mount: the kernel takes one
        reference more each time it looks a name up again after its entry timeout (a
        replicator's pass over every directory), so in a long-lived mount the counts of
        many directories grow past 255, and a dict entry beside the column for each
        would cost ~120 B where widening the column costs 1-2 B a slot."""
        try:
            self.lookups[ino] = value
        except OverflowError:
            wider = "H" if value <= 0xFFFF else "I"
            self.lookups = array(wider, self.lookups)
            self.lookups[ino] = value
            log.info("lookups: a count of %d: the column is %s from now on", value, wider)

    def set_kname(self, ino: int, value: int) -> None:
        """Set `kname` (a record, or a reference into the names arena). The column is u32
        until a value needs more (a record in volume 4,096 or later, a name past 4 GiB of
        names), then i64 for the rest of the mount and in its image."""
        try:
            self.kname[ino] = value
        except OverflowError:
            self._wide_kname()[ino] = value

    def _wide_kname(self) -> array:
        """The `kname` column, made i64 if it was not."""
        if self.kname.typecode == "I":
            self.kname = array("q", self.kname)
            log.info("kname: a value past u32: the column is i64 from now on")
        return self.kname

    def _rec(self, e: ext.Extent) -> int:
        """The `rec` column's value for a file's only extent if it is a whole record from
        file offset 0 that starts in its volume's first 4 GiB (offsets are 4 KiB aligned),
        else 0."""
        f, n, vol, off, skip, rlen = e
        if f or skip or n != rlen or off & 4095 or off >> 12 > _REC_PAGE_MASK or rlen >= _SIZE_TOP:
            return 0
        index = self.volume_index.get(vol)
        if index is None:
            if len(self.volumes) >= self.renumber_at:
                self.renumber_volumes()
            index = self.volume_index[vol] = len(self.volumes)
            self.volumes.append(vol)
        return index << _REC_PAGE_BITS | off >> 12

    def set_volumes(self, volumes: array) -> None:
        """The volume numbers `rec` indexes (a loaded image's)."""
        if not volumes or volumes[0] or len(set(volumes)) != len(volumes):
            raise ValueError("index 0 is not unused, or a volume has two indexes")
        self.volumes = volumes
        self.volume_index = {vol: i for i, vol in enumerate(volumes) if i}
        self.renumber_at = max(VOLUME_INDEXES, 2 * len(volumes))

    def renumber_volumes(self) -> None:
        """Give the volumes whole records use indexes 1, 2, ... again, dropping the others:
        one pass over the columns (0.28 s for a million files, measured without FUSE),
        once per 4,095 volumes a mount writes. If more than that many still hold records, `rec` widens, and the
        next pass waits until there are twice as many indexes."""
        rec, live = self.kname, self.of_type(_IFREG)
        files = list(itertools.compress(range(len(live)), map(operator.and_, live, map(bool, rec))))
        used = sorted({rec[ino] >> _REC_PAGE_BITS for ino in files})
        new = {old: i for i, old in enumerate(used, 1)}
        for ino in files:
            r = rec[ino]
            rec[ino] = new[r >> _REC_PAGE_BITS] << _REC_PAGE_BITS | r & _REC_PAGE_MASK
        self.set_volumes(array("I", [0, *(self.volumes[old] for old in used)]))
        log.info("volumes: %d hold whole records", len(used))

    def drop_lookups(self, pairs: Iterable[tuple[int, int]]) -> list[int]:
        """The kernel dropped these references (FORGET): the inodes left with none and no
        name either, for the caller to release. One pass over the columns, without an
        Inode view per entry (0.14 against 2.4 us each): once the kernel evicts a cold
        walk's inodes, their references come back by the hundreds of thousands."""
        lookups, links, kind, n = self.lookups, self.links, self.kind, len(self.kind)
        unused = []
        for ino, count in pairs:
            if not 0 < ino < n or not kind[ino]:
                continue
            have = lookups[ino]
            left = have - count if have > count else 0
            lookups[ino] = left
            if not left and not links[kind[ino]]:
                unused.append(ino)
        return unused

    def exists(self, ino: int) -> bool:
        return 0 < ino < len(self.kind) and self.kind[ino] != 0

    def inos(self) -> Iterator[int]:
        """Every live inode number, ascending."""
        return itertools.compress(range(len(self.kind)), self.kind)

    # Counts over a range of slots, by whole columns (C loops, ~0.5 us a slot): `packfs
    # stats` counts a range per turn of the event loop, so as not to hold it for seconds
    # at millions of inodes.

    def usage(self, start: int = 0, stop: int | None = None) -> tuple[int, int, int]:
        """(directories, other inodes, the other inodes' total size) among slots [start, stop)."""
        kind, size = self.kind[start:stop], self.size[start:stop]
        stop = start + len(kind)
        is_dir = self.of_type(_IFDIR, start, stop)
        dirs = is_dir.count(1)
        total = sum(itertools.compress(size, kind)) - sum(itertools.compress(size, is_dir))
        total += sum(n - _SIZE_TOP for ino, n in self.wide_size.items()
                     if start <= ino < stop and self.kind[ino] and not is_dir[ino - start])
        return dirs, len(kind) - kind.count(0) - dirs, total

    def nameless(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Live inodes with no name among slots [start, stop): unlinked while open when
        their daemon stopped, or still open or known to the kernel."""
        unlinked = self._of_kinds(bytes([m != 0 and n == 0 for m, n in zip(self.modes, self.links)]), start, stop)
        return list(itertools.compress(range(start, start + len(unlinked)), unlinked))

    def record_lengths(self, start: int = 0, stop: int | None = None) -> Iterator[int]:
        """The length of every record a file among slots [start, stop) holds whole in the
        `rec` column (mapped by no other extent: sharing comes only from splits): its size."""
        whole = map(operator.and_, self.of_type(_IFREG, start, stop), map(bool, self.rec[start:stop]))
        return itertools.compress(self.size[start:stop], whole)

    def mapped_record_lengths(self) -> Iterator[int]:
        """The length of every record the other extent maps refer to, each record once."""
        split = {(e[2], e[3], e[5]) for m in self.extents.values()
                 for e in (ext.PACKED.iter_unpack(m) if isinstance(m, bytes) else m)}
        return (k[2] for k in split)

    def find_free(self, below: int) -> None:
        """Collect the free slots below `below` (after a load), to be reused."""
        below = min(below, len(self.kind))
        self.free = array("q", itertools.compress(range(ROOT + 1, below),
                                                  map(operator.not_, self.kind[ROOT + 1:below])))

    # -- whole slots ------------------------------------------------------------------

    def put(self, ino: int, mode: int, uid: int, gid: int, now: int) -> None:
        """Fill a free slot with a new, empty inode."""
        self.grow(ino + 1)
        assert self.kind[ino] == 0, f"inode {ino} is in use"
        n = self.kind_of(mode, uid, gid, 2 if stat.S_ISDIR(mode) else 1)
        self.kind[ino] = n
        self.set_narrow("size", ino, 0)
        self.set_times(ino, now, now, now)
        self.kid[ino] = self.kname[ino] = 0
        self.live += 1

    def load(self, row: InodeRow, strict: bool = True) -> None:
        """Set a slot from a catalog or journal row; a directory keeps its entries. Not
        strict (fsck's repair past damage): edits of a map the slot lacks make a new one."""
        (ino, mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, target, xattrs, extents, parent) = row
        self.grow(ino + 1)
        old = self.modes[self.kind[ino]]
        if isinstance(extents, list):  # edits of the map the slot holds (read it before the size changes)
            if (old & _IFMT != _IFREG and strict) or mode & _IFMT != _IFREG:
                raise ValueError(f"a journal row edits the extent map of inode {ino}, which has none")
            extents = ext.replay_edits(self.extent_list(ino) if old & _IFMT == _IFREG else [], extents)
        if old & _IFMT == _IFREG and self.kid[ino] == IN_RECORD:
            self.kid[ino] = 0  # (the row says where its xattrs are: its map may change first)
        self._trailers.pop(ino, None)
        if old == 0:
            self.live += 1
        elif old & _IFMT != mode & _IFMT:  # a number reused for another type: drop what the old one kept
            self._release_xattrs(ino, self.xref(ino))
            if old & _IFMT == _IFDIR:
                self._clear_entries(ino)
                self.dir_xat.pop(ino, None)
            self.kid[ino] = self.kname[ino] = 0
        self._set_kind(ino, mode, uid, gid, nlink)
        if mode & _IFMT == _IFDIR:
            self.set_narrow("size", ino, 0)  # (drops a reused number's wide size)
            self.size[ino] = parent  # (see COLUMNS)
        else:
            self.set_size(ino, size)
        self.set_times(ino, atime, mtime, ctime)
        self._set_sparse(self.rdev, ino, rdev)
        self._set_sparse(self.target, ino, target)
        in_record = xattrs == IN_RECORD_ROW
        self.set_xattrs(ino, None if in_record else xattrs)
        if mode & _IFMT == _IFREG:
            self.set_extents(ino, extents if isinstance(extents, list) else
                             ext.unpack(extents) if extents else None)
        if in_record:
            if mode & _IFMT != _IFREG or not self.kname[ino]:
                raise ValueError(f"a row says inode {ino}'s record carries its xattrs, and it has no one whole record")
            self.kid[ino] = IN_RECORD

    def load_all(self, rows: Iterable[InodeRow], top: int) -> None:
        """Fill empty slots from catalog rows, inode numbers below top: the mount's bulk
        load, about twice as fast as load() per row. Unless keep_xattrs, the rows' xattrs
        field only says where the values are, which stay there: IN_CATALOG, IN_RECORD or 0."""
        self.grow(top)
        kind = self.kind
        size, mtime = self.size, self.mtime
        atimes, ctimes, atime, ctime = self.atimes, self.ctimes, self.atime, self.ctime
        rdevs, targets, extents, rec, dir_xat = self.rdev, self.target, self.extents, self.rec, self.dir_xat
        assert not self.compacting_xattrs, "a mount's load comes before any compaction"
        xat, add = self.kid, (self.xblobs.adder() if self.keep_xattrs else None)
        kid_top = xattrstore.KID_TOP
        one, unpack = ext.PACKED.size, ext.PACKED.unpack
        n = 0
        numbers = self._kind_numbers
        for ino, mode, uid, gid, links, length, a, m, c, rdev, target, x, e, parent in rows:
            n += 1
            number = numbers.get((mode, uid, gid, links)) if links < NLINK_TOP else None
            if number is None:
                self._set_kind(ino, mode, uid, gid, links)
                kind = self.kind  # (wider once there are many kinds)
            else:
                kind[ino] = number
            is_dir = mode & _IFMT == _IFDIR
            if is_dir:
                length = parent  # (see COLUMNS)
            mtime[ino] = m
            if 0 <= m - a < FAR and atime.typecode == "I":
                atime[ino] = m - a
            else:
                atimes.set(ino, a, m)
                atime = self.atime  # (whole times now, perhaps)
            if 0 <= c - m < FAR and ctime.typecode == "I":
                ctime[ino] = c - m
            else:
                ctimes.set(ino, c, m)
                ctime = self.ctime
            if length < _SIZE_TOP:
                size[ino] = length
            else:
                self.set_narrow("size", ino, length)
            if x:
                ref = x if add is None else IN_RECORD if x == IN_RECORD_ROW else add(x)  # (1: IN_CATALOG)
                if is_dir:
                    dir_xat[ino] = ref
                else:
                    if ref > kid_top:
                        xat = self._wide_kid()
                    xat[ino] = ref
            if e:
                if len(e) == one:
                    only = unpack(e)
                    r = self._rec(only) if only[1] == length else 0
                    if r:
                        if r > _KNAME_TOP:
                            rec = self._wide_kname()
                        rec[ino] = r
                        continue
                extents[ino] = e
            elif rdev:
                rdevs[ino] = rdev
            elif target:
                targets[ino] = target
        self.live += n

    def load_entries(self, dirents: Iterable[tuple[int, bytes, int]]) -> None:
        """Add catalog directory entries (parent, name, ino) to loaded directories. The
        catalog gives them by parent, so each directory's are placed once, in their final
        form: growing them one name at a time would leave the arena a string of every size
        on the way."""
        kid, dirs = self.kid, self.dirs
        add = self.names.adder()
        for parent, rows in itertools.groupby(dirents, operator.itemgetter(0)):
            _, name, ino = next(rows)
            more = [(n, i) for _, n, i in rows]
            if kid[parent] or parent in dirs:  # more of a directory seen before: not in order
                for n, i in [(name, ino), *more]:
                    self.set_child(parent, n, i)
            elif not more:
                kid[parent] = ino
                self.set_kname(parent, add(stored_name(name)))
            else:
                self._set_entries(parent, [(name, ino), *more])

    def stat(self, ino: int) -> tuple[int, int, int, int, int, int, int, int, int]:
        """(mode, nlink, uid, gid, rdev, size, atime, mtime, ctime): what getattr answers, in one call."""
        mode, uid, gid, nlink = self.kinds[self.kind[ino]]
        size = self.size[ino]
        if nlink == NLINK_TOP:
            nlink = self.wide_nlink[ino]
        if mode & _IFMT == _IFDIR:
            size = 0  # the column holds its parent
        elif size == _SIZE_TOP:
            size = self.wide_size[ino]
        return (mode, nlink, uid, gid, self.rdev.get(ino, 0), size, *self.times(ino))

    def times(self, ino: int) -> tuple[int, int, int]:
        """(atime, mtime, ctime), in ns."""
        m = self.mtime[ino]
        return self.atimes.get(ino, m), m, self.ctimes.get(ino, m)

    def set_times(self, ino: int, atime: int, mtime: int, ctime: int) -> None:
        """Set all three times (the others are kept as distances from mtime)."""
        self.mtime[ino] = mtime
        self.atimes.set(ino, atime, mtime)
        self.ctimes.set(ino, ctime, mtime)

    def modified(self, ino: int, now: int) -> None:
        """Contents or entries changed: mtime and ctime become now (every write: kept short)."""
        mtime = self.mtime
        old = mtime[ino]
        mtime[ino] = now
        self.atimes.keep(ino, old, now)
        self.ctimes.set(ino, now, now)

    def row(self, ino: int, edits: list[bytes | int] | None = None) -> InodeRow:
        """edits: a journal row's, in place of the whole map (see extents.pack_edits)."""
        mode, uid, gid, _ = self.kinds[self.kind[ino]]
        is_dir = mode & _IFMT == _IFDIR
        extents = (self.packed_extents(ino) if edits is None else edits) if stat.S_ISREG(mode) else None
        return (ino, mode, uid, gid, self.nlink_of(ino), 0 if is_dir else self.get_narrow("size", ino),
                *self.times(ino), self.rdev.get(ino, 0),
                self.target.get(ino), self.row_xattrs(ino), extents, self.size[ino] if is_dir else 0)

    def drop(self, ino: int) -> None:
        """Free a slot and everything kept for it."""
        if not self.exists(ino):
            return
        self._release_xattrs(ino, self.xref(ino))
        if self.modes[self.kind[ino]] & _IFMT == _IFDIR:
            self._clear_entries(ino)
            self.dir_xat.pop(ino, None)
        self.kind[ino] = self.kid[ino] = self.kname[ino] = 0
        self.xattr_epoch += 1
        self.lookups[ino] = 0
        for sparse in (self.rdev, self.target, self._fetched, self._plain, self.extents, self.opens, self.wbuf,
                       self.wide_nlink, self._trailers):
            sparse.pop(ino, None)
        self.atimes.clear(ino)
        self.ctimes.clear(ino)
        self.free.append(ino)
        self.live -= 1
        if self.xattrs_changed is not None:
            self.xattrs_changed(ino)

    def _clear_entries(self, ino: int) -> None:
        self._clear_single(ino)
        self.dirs.pop(ino, None)

    # -- extent maps ------------------------------------------------------------------

    def extent_list(self, ino: int) -> list[ext.Extent]:
        """A file's extent map ([] for anything else). A map kept as a list is returned
        itself, to be edited in place."""
        if self.modes[self.kind[ino]] & _IFMT != _IFREG:
            return []
        r = self.kname[ino]
        if r:
            n = self.size[ino]
            return [(0, n, self.volumes[r >> _REC_PAGE_BITS], (r & _REC_PAGE_MASK) << 12, 0, n)]
        e = self.extents.get(ino)
        if isinstance(e, bytes):
            return list(ext.PACKED.iter_unpack(e))
        return e or []

    def mapped_bytes(self, ino: int) -> int:
        """The bytes of a regular file its extents map (holes map none; 0 for anything
        else): what its st_blocks counts, with its unflushed run (WriteBehind.data_bytes).
        A map kept as a list (more than ext.PACKED_MAX extents) is summed each time: ~12 ns
        an extent, 0.5 ms for a SQLite database rewritten into 41,000."""
        if self.modes[self.kind[ino]] & _IFMT != _IFREG:
            return 0
        if self.kname[ino]:
            return self.size[ino]  # one whole record, as long as the file
        e = self.extents.get(ino)
        if isinstance(e, bytes):
            return sum(x[1] for x in ext.PACKED.iter_unpack(e))
        return sum(map(operator.itemgetter(1), e or ()))

    def extent_count(self, ino: int) -> int:
        """How many extents a file's map holds (0 for anything else), without unpacking it."""
        if self.modes[self.kind[ino]] & _IFMT != _IFREG:
            return 0
        if self.kname[ino]:
            return 1
        e = self.extents.get(ino)
        return len(e) // ext.PACKED.size if isinstance(e, bytes) else len(e or ())

    def set_extents(self, ino: int, value: list[ext.Extent] | None) -> None:
        """A regular file's new extent map (set its size first: a whole record goes in
        `rec` only if it is as long as the file)."""
        only = value[0] if value and len(value) == 1 else None
        r = self._rec(only) if only and only[1] == self.size[ino] else 0
        if r != self.kname[ino]:
            self._leave_record(ino)
        self.set_kname(ino, r)
        if r:
            self.extents.pop(ino, None)
        elif value:
            self.extents[ino] = ext.pack(value) if len(value) <= ext.PACKED_MAX else value  # type: ignore[assignment]
        else:
            self.extents.pop(ino, None)

    def packed_extents(self, ino: int) -> bytes:
        e = self.extents.get(ino)
        return e if isinstance(e, bytes) else ext.pack(self.extent_list(ino))  # type: ignore[return-value]

    @staticmethod
    def _set_sparse(d: dict, ino: int, value: Any) -> None:
        if value:
            d[ino] = value
        else:
            d.pop(ino, None)

    # -- directory entries ------------------------------------------------------------

    # Directories only: for anything else, `kid` and `kname` hold xattrs and a record.

    def child(self, d: int, name: bytes) -> int | None:
        big = self.dirs.get(d)
        if big is not None:
            return big.get(name)
        k = self.kid[d]
        if k == SMALL:
            return small_get(self.names.get(self.kname[d]), name)
        return k if k and self.names.equals(self.kname[d], stored_name(name)) else None

    def children(self, d: int) -> list[tuple[bytes, int]]:
        big = self.dirs.get(d)
        if big is not None:
            return list(big.items())
        k = self.kid[d]
        if not k or self.modes[self.kind[d]] & _IFMT != _IFDIR:
            return []
        if k == SMALL:
            return small_items(self.names.get(self.kname[d]))
        return [(name_of(self.names.get(self.kname[d])), k)]

    def has_children(self, d: int) -> bool:
        return d in self.dirs or self.kid[d] != 0

    def set_child(self, d: int, name: bytes, ino: int) -> None:
        big = self.dirs.get(d)
        if big is not None:
            big[name] = ino
            self._dict_if_large(d)
            return
        k = self.kid[d]
        if not k:
            self.kid[d] = ino
            self.set_kname(d, self.names.put(stored_name(name)))
        elif k != SMALL and self.names.equals(self.kname[d], stored_name(name)):
            self.kid[d] = ino
        else:
            entries = dict(self.children(d))
            entries[name] = ino
            self._set_entries(d, list(entries.items()))

    def del_child(self, d: int, name: bytes) -> None:
        """Remove a name if present, shrinking back to the one-name form."""
        big = self.dirs.get(d)
        if big is not None:
            big.pop(name, None)
            if len(big) <= 1:
                del self.dirs[d]
                for n, k in big.items():
                    self.kid[d] = k
                    self.set_kname(d, self.names.put(stored_name(n)))
            return
        k = self.kid[d]
        if k == SMALL:
            entries = self.children(d)
            rest = [(n, i) for n, i in entries if n != name]
            if len(rest) < len(entries):
                self._set_entries(d, rest)
        elif k and self.names.equals(self.kname[d], stored_name(name)):
            self._clear_single(d)

    def _set_entries(self, d: int, entries: list[tuple[bytes, int]]) -> None:
        """Store a directory's entries (at least one; the directory is not in `dirs`): one
        name or a few in its slot, or PackedEntries if they are too many."""
        self._clear_single(d)
        if len(entries) == 1:
            (name, ino), = entries
            self.kid[d] = ino
            self.set_kname(d, self.names.put(stored_name(name)))
            return
        packed = pack_small(entries)
        if packed is not None:
            self.kid[d] = SMALL
            self.set_kname(d, self.names.put(packed))
        else:
            self.dirs[d] = PackedEntries(entries)
            self._dict_if_large(d)

    def _dict_if_large(self, d: int) -> None:
        """Turn a directory's packed entries into a dict once their names pass PACKED_MAX."""
        big = self.dirs[d]
        if type(big) is PackedEntries and big.nbytes() > PACKED_MAX:
            self.dirs[d] = dict(big.items())

    def _clear_single(self, d: int) -> None:
        """Forget the entries a directory keeps in its slot (their arena space is freed)."""
        self.names.release(self.kname[d])
        self.kid[d] = self.kname[d] = 0


def _sparse(name: str, default: Any, doc: str) -> property:
    def get(self: "Inode") -> Any:
        return getattr(self.t, name).get(self.ino, default)

    def set_(self: "Inode", value: Any) -> None:
        InodeTable._set_sparse(getattr(self.t, name), self.ino, value)
    return property(get, set_, doc=doc)


def _time(which: int, doc: str) -> property:
    """One of (atime, mtime, ctime): set together, since atime and ctime are kept as distances from mtime."""
    def get(self: "Inode") -> int:
        return self.t.times(self.ino)[which]

    def set_(self: "Inode", value: int) -> None:
        times = list(self.t.times(self.ino))
        times[which] = value
        self.t.set_times(self.ino, *times)
    return property(get, set_, doc=doc)


class Inode:
    """A view of one inode's slot. Two views of one inode are equal, not identical.

    Xattrs and extents rest in their packed forms (bytes): most inodes are written once
    and then only read or listed. `xattrs` and `extents` give a map to edit, and their
    setters store the edited map again.
    """

    __slots__ = ("t", "ino")

    def __init__(self, table: InodeTable, ino: int) -> None:
        self.t = table
        self.ino = ino

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Inode) and other.ino == self.ino and other.t is self.t

    def __hash__(self) -> int:
        return self.ino

    def __repr__(self) -> str:
        return f"<Inode {self.ino} mode {self.mode:o}>"

    @property
    def mode(self) -> int:
        """file type and permissions"""
        return self.t.modes[self.t.kind[self.ino]]

    @mode.setter
    def mode(self, value: int) -> None:
        self.t.set_mode(self.ino, value)

    @property
    def uid(self) -> int:
        """owner"""
        return self.t.kinds[self.t.kind[self.ino]][1]

    @uid.setter
    def uid(self, value: int) -> None:
        self.t.set_owner(self.ino, value, self.gid)

    @property
    def gid(self) -> int:
        """group"""
        return self.t.kinds[self.t.kind[self.ino]][2]

    @gid.setter
    def gid(self, value: int) -> None:
        self.t.set_owner(self.ino, self.uid, value)

    @property
    def nlink(self) -> int:
        """link count"""
        return self.t.nlink_of(self.ino)

    @nlink.setter
    def nlink(self, value: int) -> None:
        self.t.set_nlink(self.ino, value)

    @property
    def size(self) -> int:
        """size in bytes (a directory's is 0: its slot holds its parent there)"""
        return 0 if self.is_dir else self.t.get_narrow("size", self.ino)

    @size.setter
    def size(self, value: int) -> None:
        assert not self.is_dir, "a directory has no size to set"
        self.t.set_size(self.ino, value)
    atime = _time(0, "access time, ns")
    mtime = _time(1, "modification time, ns")
    ctime = _time(2, "change time, ns")

    def times(self) -> tuple[int, int, int]:
        """(atime, mtime, ctime), in ns."""
        return self.t.times(self.ino)

    def set_times(self, atime: int, mtime: int, ctime: int) -> None:
        self.t.set_times(self.ino, atime, mtime, ctime)

    def modified(self, now: int) -> None:
        """Contents or entries changed: mtime and ctime become now."""
        self.t.modified(self.ino, now)

    @property
    def parent(self) -> int:
        """a directory's parent (for ..); 0 for anything else"""
        return self.t.size[self.ino] if self.is_dir else 0

    @parent.setter
    def parent(self, value: int) -> None:
        assert self.is_dir, "only a directory keeps its parent"
        self.t.size[self.ino] = value
    rdev = _sparse("rdev", 0, "device number of a special file")
    target = _sparse("target", None, "a symlink's target")
    opens = _sparse("opens", 0, "open file handles")

    @property
    def lookups(self) -> int:
        """the kernel's references (FUSE lookup count), dropped by forget"""
        return self.t.lookups[self.ino]

    @lookups.setter
    def lookups(self, value: int) -> None:
        self.t.set_lookups(self.ino, value)
    wbuf = _sparse("wbuf", None, "writeback.Buffer while the file has unflushed data")

    @property
    def is_dir(self) -> bool:
        return self.t.modes[self.t.kind[self.ino]] & _IFMT == _IFDIR

    @property
    def is_reg(self) -> bool:
        return self.t.modes[self.t.kind[self.ino]] & _IFMT == _IFREG

    # -- directory entries ------------------------------------------------------------

    def child(self, name: bytes) -> int | None:
        return self.t.child(self.ino, name)

    def children(self) -> list[tuple[bytes, int]]:
        """The (name, ino) pairs of a directory; [] for anything else."""
        return self.t.children(self.ino)

    def has_children(self) -> bool:
        return self.t.has_children(self.ino)

    def set_child(self, name: bytes, ino: int) -> None:
        self.t.set_child(self.ino, name, ino)

    def del_child(self, name: bytes) -> None:
        self.t.del_child(self.ino, name)

    # -- extents and xattrs -----------------------------------------------------------

    @property
    def extents(self) -> list[ext.Extent] | None:
        """The extent map to edit (assign it back to store the edit); None for anything but a file."""
        return self.t.extent_list(self.ino) if self.is_reg else None

    @extents.setter
    def extents(self, value: list[ext.Extent] | None) -> None:
        self.t.set_extents(self.ino, value)

    def extent_list(self) -> list[ext.Extent]:
        """The extent map, to read."""
        return self.t.extent_list(self.ino)

    @property
    def xattrs(self) -> dict[bytes, bytes] | None:
        """The xattrs, unpacked for editing."""
        return unpack_xattrs(self.t.plain_xattrs(self.ino))

    @xattrs.setter
    def xattrs(self, value: dict[bytes, bytes] | None) -> None:
        self.t.set_xattrs(self.ino, pack_xattrs(value, compress=False))  # see compress_xattrs

    def getxattr(self, name: bytes) -> bytes | None:
        x = self.t.plain_xattrs(self.ino)
        if x is None:
            return None
        for n, a, b in iter_xattrs(x):
            if n == name:
                return x[a:b]
        return None

    def xattr_names(self) -> list[bytes]:
        x = self.t.plain_xattrs(self.ino)
        return [n for n, _, _ in iter_xattrs(x)] if x else []

    def row(self) -> InodeRow:
        return self.t.row(self.ino)
