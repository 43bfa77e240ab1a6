"""The inode table's xattrs: where each inode's values are, and how they are kept small.

An inode's xattrs are one packed blob (xattrblob.py), named by its `kid` column (as
`xat`); a directory's `kid` holds an entry, so a directory's reference is in the
`dir_xat` dict. A reference is a string of the `xblobs` arena, 0 for none, IN_CATALOG
when only the catalog holds the value, or IN_RECORD when a regular file's one whole
record carries it in its padding (records.XATTRS). With `keep_xattrs` off a checkpoint
lets go of the values it wrote (`checkpointed`), which saves Swift's metadata, the
largest thing an object has: a Swift object's metadata is then read from its record,
with the read its GET makes anyway, and only values no record carries cost a catalog
read (`packed_xattrs`). A value goes to a record when the file's bytes are flushed as one
record with its xattrs already set (`trailer_for`, Swift's PUT: write, fsetxattr, fsync);
from the checkpoint that takes it on, its rows in the catalog and the log say IN_RECORD_ROW
instead of the value. A file whose map or size changes gets its value back in memory
first (`_leave_record`), so IN_RECORD always means the record the map names. setxattr
stores Swift's blobs plain (`_plain`) and the journal's background compressor compresses
them a turn later (`compress_xattrs`); freed arena space is compacted in parts once it
outweighs the values (`compact_xattrs`).

XattrStore is a part of InodeTable, its base class, kept in a module of its own as a
whole of its own. Of the rest of the table it uses the `kind`, `modes` and `kid` columns
and `not_dirs`, `_of_kinds`, `exists` and `_set_sparse`; the table calls
`_init_xattrs` when it is made and releases a slot's value when the slot is freed.
"""
from __future__ import annotations

import functools
import itertools
import logging
import operator
import stat
from array import array
from typing import Any, Callable, Iterable

from ..errors import FsError
from ..store import records
from .arena import CountedArena
from .inoderow import InodeRow
from .xattrblob import compressed, compressible, is_compressed, plain

log = logging.getLogger(__name__)

_FETCHED_MAX = 256
_DECODED_MAX = 64  # inodes whose xattrs are kept decoded: a Swift GET reads them ~5 times
XATTR_GRAIN = 8  # xattr blobs take arena space in steps of this many bytes (Swift's: ~55-65 B)
XATTR_COMPACT_MIN = 64 << 20  # freed xattr arena space worth compacting, at least (see compact_xattrs)
XATTR_COMPACT_SLOTS = 4096  # inodes a part of a compaction goes over, at most
XATTR_COMPACT_BYTES = 256 << 10  # and bytes of values it copies, at most
KID_TOP = 0xFFFFFFFF  # `kid` is u32 until an xattr reference needs more
IN_CATALOG = 1  # `xat` of an inode whose xattrs only the catalog holds (no arena string has this reference)
IN_RECORD = 2  # `xat` of a regular file whose one whole record carries its xattrs (nor has this one)
IN_RECORD_ROW = b"\xff\xfc"  # a catalog or journal row's xattrs field for those (no packed blob is this)
_IFMT = 0o170000  # the file type bits of a mode
_IFDIR = stat.S_IFDIR
_IFREG = stat.S_IFREG


class XattrStore:
    """InodeTable's xattrs (see the module)."""

    # What it uses of the rest of the table (InodeTable's):
    kind: array
    modes: list[int]
    kid: array
    kname: array
    extent_list: Callable[[int], list]
    not_dirs: Callable[..., bytes]
    _of_kinds: Callable[[bytes, int, int | None], bytes]
    exists: Callable[[int], bool]
    _set_sparse: Callable[[dict, int, Any], None]

    def _init_xattrs(self) -> None:
        """An empty table's xattr state (InodeTable.__init__ calls it)."""
        # Packed xattrs in an arena (`xat` is the reference, 0 for none: `kid`, or
        # `dir_xat` for a directory, see xref): all of them while
        # keep_xattrs, else only those the catalog does not hold yet (`xat` is IN_CATALOG
        # for the others). An inode whose `xat` is 0 has none, whatever the catalog has,
        # unless it has a blob in `_plain` (see set_xattrs).
        self.keep_xattrs = True
        # Told of every inode whose xattrs change or that goes, before anything can read it
        # again: the FUSE adapter keeps copies of some inodes' xattrs (fuseshim.cache_xattrs).
        self.xattrs_changed: Callable[[int], None] | None = None
        self.dir_xat: dict[int, int] = {}  # a directory's `xat`, if not 0 (its `kid` holds an entry)
        self.xblobs = CountedArena(XATTR_GRAIN)
        # While a compaction of the xattr arena runs (compact_xattrs), the values of the
        # inodes below `_xcursor` are in `_xnew`, the others still in `xblobs`; `_xmoved`
        # bytes of `xblobs` are values copied already.
        self._xnew: CountedArena | None = None
        self._xcursor = self._xmoved = 0
        self.on_compaction_due: Callable[[], None] | None = None  # told when a free makes one due
        self.fetch_xattrs: Callable[[int], bytes | None] = lambda ino: None  # from the catalog
        # From a DATA record's padding (Volumes.read_trailer: volume, offset, length, inode).
        self.read_trailer: Callable[[int, int, int, int], bytes] = _no_volumes
        self._trailers: dict[int, int] = {}  # files whose record carries their xattrs since it was written: its `rec`
        self._fetched: dict[int, bytes | None] = {}  # the last few values fetched (a GET reads them ~5 times)
        self.xattr_epoch = 0  # counts xattr changes and freed slots (see keep_fetched)
        self._plain: dict[int, bytes] = {}  # blobs set plain, not compressed yet (see set_xattrs)
        self._uncompressed: set[int] = set()  # set by setxattr since the last compress_xattrs
        self._settling: set[int] = set()  # of those, set in the compressor's last two turns
        self._turn = 0  # the background compressor's turns, one after each commit
        self._set_in_turn: dict[int, int] = {}  # the turn each of those was set in
        self._decoded: dict[int, tuple[bytes, bytes]] = {}  # the last few read: (stored blob, plain blob)

    def packed_xattrs(self, ino: int) -> bytes | None:
        """An inode's xattrs, packed: from memory if changed since the last checkpoint, else
        from its record or the catalog (through its own read connection: WAL readers never
        wait)."""
        ref = self.xref(ino)
        if ref > IN_RECORD:
            return self._xblobs_of(ino).get(ref)
        if not ref:
            return self._plain.get(ino)
        x = self._fetched.get(ino)
        if x is None:
            x = self.xattr_fetcher(ino)()
            self._remember(ino, x)
        return x

    def row_xattrs(self, ino: int) -> bytes | None:
        """The xattrs field of ino's row for the catalog or the log: IN_RECORD_ROW where its
        record carries them (see the module), else the value."""
        ref = self.xref(ino)
        if ref == IN_RECORD or (not self.keep_xattrs and ref != IN_CATALOG and self._trailer_current(ino)):
            return IN_RECORD_ROW
        return self.packed_xattrs(ino)

    def _trailer_current(self, ino: int) -> bool:
        """Whether ino's record carries its xattrs as they are (written since the last
        checkpoint, and neither changed since)."""
        r = self._trailers.get(ino)
        return r is not None and r == self.kname[ino]

    def xattrs_to_fetch(self, ino: int) -> bool:
        """Whether reading ino's xattrs would read its record or the catalog (see keep_fetched)."""
        return self.exists(ino) and self.xref(ino) in (IN_CATALOG, IN_RECORD) and ino not in self._fetched

    def xattr_fetcher(self, ino: int) -> Callable[[], bytes | None]:
        """The read of ino's xattrs from where they are, to run in any thread: its record
        (where it is now), or the catalog."""
        if self.xref(ino) == IN_RECORD:
            _, n, vol, off, _, _ = self.extent_list(ino)[0]
            return functools.partial(self.read_trailer, vol, off, n, ino)
        return functools.partial(self.fetch_xattrs, ino)

    def keep_fetched(self, ino: int, x: bytes | None, epoch: int) -> None:
        """Keep ino's xattrs, read from its record or the catalog off the event loop while
        `xattr_epoch` was epoch. Dropped if any xattrs changed or any slot was freed since:
        the read may have given an older value, or a freed inode's."""
        if epoch == self.xattr_epoch and self.xref(ino) in (IN_CATALOG, IN_RECORD):
            self._remember(ino, x)

    def trailer_for(self, ino: int, length: int) -> bytes:
        """The xattrs to write in the padding of a record of `length` bytes that will be
        file ino's one whole record (b"": none, they do not fit, or they stay in memory
        anyway: keep_xattrs). As they are: a blob set plain and not compressed yet
        (Swift's, ~440 B) is read back without decoding; compressed only if that makes
        it fit (~60 B)."""
        if self.keep_xattrs:
            return b""
        ref = self.xref(ino)
        x = self._xblobs_of(ino).get(ref) if ref > IN_RECORD else self._plain.get(ino) if not ref else None
        if not x:
            return b""
        if not records.trailer_fits(length, len(x)) and not ref and compressible(x):
            x = compressed(x)
        return x if records.trailer_fits(length, len(x)) else b""

    def wrote_trailer(self, ino: int) -> None:
        """File ino's record, now its map, carries its xattrs (trailer_for). (Its map is one
        whole record, unless `rec` cannot name it: then they stay in memory.)"""
        if self.kname[ino]:
            self._trailers[ino] = self.kname[ino]

    def _leave_record(self, ino: int) -> None:
        """File ino's map or size is about to change: the xattrs its record carries come
        back into memory first (a read of the record, on the loop: Swift never rewrites an
        object). Any other file: nothing to do. A record whose xattrs do not read back
        (damaged: reading them said EIO) leaves the file none, with a log line: fsck's
        repair of a damaged file, or a write to it, goes on."""
        self._trailers.pop(ino, None)
        if self.kid[ino] == IN_RECORD and self.modes[self.kind[ino]] & _IFMT == _IFREG:
            try:
                x = self.packed_xattrs(ino)
            except FsError:
                log.error("inode %d: the xattrs its damaged record carried are lost", ino)
                x = None
            self.set_xattrs(ino, x)

    def _remember(self, ino: int, x: bytes | None) -> None:
        if ino not in self._fetched and len(self._fetched) >= _FETCHED_MAX:
            del self._fetched[next(iter(self._fetched))]
        self._fetched[ino] = x

    def plain_xattrs(self, ino: int) -> bytes | None:
        """An inode's xattrs, packed plain. Decoding Swift's metadata takes ~10 us (its
        pickle is made again), so the last few are kept, checked against the stored blob."""
        x = self.packed_xattrs(ino)
        if x is None or not is_compressed(x):
            return x
        kept = self._decoded.get(ino)
        if kept is not None and kept[0] == x:
            return kept[1]
        p = plain(x)
        if len(self._decoded) >= _DECODED_MAX:
            del self._decoded[next(iter(self._decoded))]
        self._decoded[ino] = (x, p)
        return p

    def xref(self, ino: int) -> int:
        """An inode's `xat`: where its xattrs are (see __init__)."""
        if self.modes[self.kind[ino]] & _IFMT == _IFDIR:
            return self.dir_xat.get(ino, 0)
        return self.kid[ino]

    def _set_xref(self, ino: int, ref: int) -> None:
        if self.modes[self.kind[ino]] & _IFMT == _IFDIR:
            self._set_sparse(self.dir_xat, ino, ref)
        elif ref > KID_TOP:
            self._wide_kid()[ino] = ref
        else:
            self.kid[ino] = ref

    def _wide_kid(self) -> array:
        """The `kid` column, made i64 if it was not (an xattr reference past 32 GiB of values)."""
        if self.kid.typecode == "I":
            self.kid = array("q", self.kid)
            log.info("kid: an xattr reference past u32: the column is i64 from now on")
        return self.kid

    def _xblobs_of(self, ino: int) -> CountedArena:
        """The arena that holds ino's value (see compact_xattrs)."""
        return self._xnew if ino < self._xcursor else self.xblobs  # type: ignore[return-value]

    def _release_xattrs(self, ino: int, ref: int) -> None:
        """Free ino's value's arena space, `ref` (IN_CATALOG and 0 hold none); say so
        when that makes a compaction due."""
        if ref > IN_RECORD:
            self._xblobs_of(ino).release(ref)
            if self.on_compaction_due is not None and self.xattr_compaction_due():
                self.on_compaction_due()

    def xattr_refs(self, slots: int) -> tuple[array, Callable[[], bytes]]:
        """Every xattr reference: `kid` of slots [0, slots), then the directories'
        (`dir_xat`); and a function giving 1 for those that name an arena string (a
        directory's `kid` is no reference; IN_CATALOG, IN_RECORD and 0 name none). A compaction
        under way is finished first: then they all name strings of `xblobs`."""
        self.finish_compacting_xattrs()
        refs = self.kid[:slots]
        refs.extend(self.dir_xat.values())

        def naming() -> bytes:
            holders = self.not_dirs(0, slots) + b"\1" * len(self.dir_xat)
            return bytes(map(operator.and_, holders, map(IN_RECORD.__lt__, refs)))
        return refs, naming

    @property
    def compacting_xattrs(self) -> bool:
        """Whether a compaction of the xattr arena is under way."""
        return self._xnew is not None

    def xattr_compaction_due(self) -> bool:
        """Whether the xattr arena's free space is more than its live values and
        XATTR_COMPACT_MIN. A freed run is reused only by a value of its size class, which
        keeps Swift's churn in place, but values of ever other sizes, which anyone who may
        write a file can set, grew the arena for as long as the mount ran: a minute of
        setxattrs of random sizes left 104 of its 136 MB free. Waiting until the frees
        outweigh the values makes them pay for the copy."""
        blobs = self.xblobs
        return blobs.wasted() > max(blobs.used, XATTR_COMPACT_MIN)

    def compact_xattrs(self, slots: int = XATTR_COMPACT_SLOTS, budget: int = XATTR_COMPACT_BYTES) -> bool:
        """A part of a compaction of the xattr arena: start one if none runs and one is
        due, then copy the values of the next `slots` inodes (fewer once `budget` bytes
        are copied) into a new arena; True while the compaction is not done.

        Copying the whole arena at once held the event loop 0.8-1.1 s at a million
        values; in parts, requests come in between. The inodes below the cursor
        have their values in the new arena (_xblobs_of), so a value set, freed or read
        between two parts goes to the arena that holds it. The part that reaches the
        last slot (the table may have grown meanwhile) puts the new arena in the old
        one's place."""
        if self._xnew is None:
            if not self.xattr_compaction_due():
                return False
            self._xnew, self._xcursor, self._xmoved = CountedArena(XATTR_GRAIN), 0, 0
        start, stop = self._xcursor, min(len(self.kind), self._xcursor + slots)
        if self.dir_xat:  # a directory's value is in dir_xat: look at every live slot
            holders = self._of_kinds(bytes([m != 0 for m in self.modes]), start, stop)
        else:
            named = map(IN_RECORD.__lt__, self.kid[start:stop])
            holders = bytes(map(operator.and_, self.not_dirs(start, stop), named))
        old, new = self.xblobs, self._xnew
        used = new.used
        for ino in itertools.compress(range(start, stop), holders):
            ref = self.xref(ino)
            if ref > IN_RECORD:
                value = old.get(ref)
                self._set_xref(ino, new.append(value))
                budget -= len(value)
                if budget <= 0:
                    stop = ino + 1
                    break
        self._xcursor = stop
        self._xmoved += new.used - used
        if stop < len(self.kind):
            return True
        self.xblobs, self._xnew, self._xcursor = new, None, 0
        return False

    def finish_compacting_xattrs(self) -> None:
        """Do what is left of a compaction under way at once (before an image is written
        from the arena)."""
        if self._xnew is not None:
            self.compact_xattrs(slots=len(self.kind), budget=1 << 62)

    def xattr_arena_bytes(self) -> tuple[int, int]:
        """(bytes, free bytes) of the xattr arena, and of the new one while a compaction
        runs (the old one's values already copied count as free)."""
        blobs, new = self.xblobs, self._xnew
        if new is None:
            return len(blobs.data), blobs.wasted()
        return len(blobs.data) + len(new.data), blobs.wasted() + self._xmoved + new.wasted()

    def xattrs_in_memory(self, start: int = 0, stop: int | None = None) -> int:
        """How many inodes among slots [start, stop) have their xattr values in memory.
        `stats` counts a range at a time: over the whole table this builds ~7 MB of
        copies at a million objects, which most likely stayed in the daemon's RSS
        (the 1M run at 5c73fa5, 2026-11-26)."""
        kid = self.kid[start:stop]
        stop = start + len(kid)
        refs = array(kid.typecode, itertools.compress(kid, self.not_dirs(start, stop)))
        refs.extend(ref for ino, ref in self.dir_xat.items() if start <= ino < stop)
        elsewhere = refs.count(0) + refs.count(IN_CATALOG) + refs.count(IN_RECORD)
        return len(refs) - elsewhere + sum(start <= ino < stop for ino in self._plain)

    def xattrs_in_records(self, start: int = 0, stop: int | None = None) -> int:
        """How many files among slots [start, stop) have their xattrs in their record only."""
        kid = self.kid[start:stop]
        return sum(itertools.compress(map(IN_RECORD.__eq__, kid), self.not_dirs(start, start + len(kid))))

    def xattrs_in_catalog(self) -> int:
        """How many inodes have their xattrs in the catalog only (IN_CATALOG)."""
        refs = itertools.compress(self.kid, self.not_dirs())
        return sum(map(IN_CATALOG.__eq__, refs)) + sum(ref == IN_CATALOG for ref in self.dir_xat.values())

    def uncompressed(self) -> int:
        """How many inodes' xattrs wait for compress_xattrs (none once a checkpoint has
        begun: an image must not be written before)."""
        return len(self._plain)

    def set_xattrs(self, ino: int, packed: bytes | None) -> None:
        """An inode's new xattrs, held in memory (until a checkpoint writes them, unless
        keep_xattrs). A blob compress_xattrs will compress (Swift's metadata, ~440 B) waits
        in `_plain`, out of the arena: the arena reuses a freed run only for a string of
        its size, and the runs of these short-lived blobs, in as many sizes as Swift's
        object names have lengths, were left free (8 B per object at a million)."""
        old = self.xref(ino)
        self._plain.pop(ino, None)
        self._trailers.pop(ino, None)
        if packed and compressible(packed):
            self._plain[ino] = packed
            ref = 0
            self._uncompressed.add(ino)
            self._set_in_turn[ino] = self._turn
        else:
            ref = self._xblobs_of(ino).put(packed) if packed else 0
        self._set_xref(ino, ref)  # (0, no value, hides whatever the catalog holds)
        self._release_xattrs(ino, old)
        self._fetched.pop(ino, None)
        self.xattr_epoch += 1
        if self.xattrs_changed is not None:
            self.xattrs_changed(ino)

    def compress_xattrs(self, limit: int = 1 << 62, settled_only: bool = False, budget: int = 1 << 62) -> bool:
        """Compress up to `limit` of the xattrs stored plain, and no more once `budget`
        bytes of them are done; True if some are left.

        setxattr stores them plain: Swift sets two per PUT, and compressing on each
        (after decompressing for the second) took ~60 us of the request's own time.
        The journal compresses them in the background after each commit, a turn at a
        time (next_compress_turn), while the commit's flush runs; there, settled_only
        leaves those set in this turn or the last one for later. Swift sets its second
        xattr after another PUT's commit more often than not, and compressing the first
        alone cost a compression and a decompression more per PUT (1.36 compressions and
        0.38 decompressions per PUT at concurrency 16, against 1.0 and 0 when they waited
        for the file's close; the kernel sends no close once files open without a request).
        """
        pending, plain_blobs, set_in = self._uncompressed, self._plain, self._set_in_turn
        if not settled_only:
            pending |= self._settling
            self._settling.clear()
        for _ in range(min(limit, len(pending))):
            ino = pending.pop()
            if settled_only and set_in.get(ino, -2) >= self._turn - 1:
                self._settling.add(ino)
                continue
            set_in.pop(ino, None)
            x = plain_blobs.pop(ino, None)
            if x is not None:  # (else set again since, not compressible, or gone)
                self._set_xref(ino, self._xblobs_of(ino).put(compressed(x)))
                budget -= len(x)
                if budget <= 0:
                    break
        return bool(pending)

    def next_compress_turn(self) -> None:
        """The background compressor's next turn (after a commit): what was settling may
        be compressed once it has not changed for two turns."""
        self._turn += 1
        self._uncompressed |= self._settling
        self._settling.clear()

    def checkpointed(self, rows: Iterable[InodeRow]) -> None:
        """The catalog now holds these rows: forget the xattrs that have not changed since
        they were taken (the same bytes), to read them from the catalog, or the record a
        row says carries them, from now on."""
        if self.keep_xattrs:
            return
        for row in rows:
            ino, x = row[0], row[11]
            ref = self.xref(ino)
            if x == IN_RECORD_ROW:
                if ref != IN_RECORD and self._trailer_current(ino):  # (else changed since the row)
                    del self._trailers[ino]
                    self._plain.pop(ino, None)
                    self._release_xattrs(ino, ref)
                    self._set_xref(ino, IN_RECORD)
            elif ref > IN_RECORD and x is not None and self._xblobs_of(ino).equals(ref, x):
                self._release_xattrs(ino, ref)
                self._set_xref(ino, IN_CATALOG)
            elif not ref and x is not None and self._plain.get(ino) == x:
                del self._plain[ino]
                self._set_xref(ino, IN_CATALOG)


def _no_volumes(volume: int, offset: int, length: int, ino: int) -> bytes:
    raise RuntimeError("the inode table reads a record's xattrs before it was given the volumes")
