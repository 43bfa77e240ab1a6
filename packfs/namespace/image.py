"""The namespace image: the inode table as a clean unmount left it, for a fast next mount.

The catalog is the truth, but loading it costs one SQLite row per inode: most of a
mount's time at a million objects (three million inodes). The image holds the same
table as raw columns and a few marshalled dicts, which load several times faster. It is
only a cache of the catalog, like Bitcask's hint files, never a second truth:

- it is written after the final checkpoint of a clean unmount, and only then named in
  the catalog by a random token (so a crash while writing it leaves no token);
- every checkpoint removes the token in its own transaction, then the file (fsck's
  repairs too); until a mount's first checkpoint the catalog has not changed, so a crash
  before it recovers from the image as well, replaying the log after it;
- an image that is missing, damaged, of another version or layout, whose token is not
  the catalog's, or taken at another checkpoint position (a catalog an older packfs
  changed), is not used: the mount loads the catalog instead and says why.

The format is in docs/on-disk-format.md.
"""
from __future__ import annotations

import logging
import marshal
import mmap
import os
import secrets
import stat
import struct
import sys
from array import array
from typing import Callable, Iterator

from zlib_ng.zlib_ng import crc32

from . import inodes
from .arena import Arena
from .dirents import PackedEntries
from .inodes import InodeTable

log = logging.getLogger(__name__)

FILENAME = "namespace.img"
VERSION = 11  # 11: `kid` may be IN_RECORD, and the arenas keep two grains for no string
_MAGIC = b"PKFSIMG\0"
# magic, version, flags, token, the catalog stamp (volume, offset, seq, next_ino), slots, live inodes
_HEADER = struct.Struct("<8sIIQ4QQQ")
_CRC = struct.Struct("<I")
_SECTION = struct.Struct("<QI")  # payload length, CRC-32 of the payload
_KEEP_XATTRS = 1  # flag: every xattr value is in the image (xattrs_in_memory)
_MARSHAL_VERSION = 4
# The saved columns, in file order; the lookup counts belong to a running mount only.
COLUMNS = tuple(c for c in inodes.COLUMNS if c not in inodes.RUNTIME_COLUMNS)
# Columns a table may have made wider, and to what: kinds past 256, then past
# KINDS_NARROW; whole times (see offsettimes.py); records and name references past u32;
# xattr references past 32 GiB of values (in `kid`).
_WIDER = {"kind": "HI", "atime": "q", "ctime": "q", "kname": "q", "kid": "q"}


# The catalog's checkpoint position and next_ino when the image was taken: a catalog
# changed by anything that does not know about images (an older packfs) has moved on.
Stamp = tuple[int, int, int, int]


class ImageError(Exception):
    """The image cannot stand in for the catalog (the reason is the message)."""


def new_token() -> int:
    """A token naming one image: random, nonzero, and a signed 64-bit SQLite integer."""
    return secrets.randbits(62) + 1


def save(packdir: str, table: InodeTable, token: int, stamp: Stamp) -> int:
    """Write the table's image (under a temporary name, fsync'd, then renamed); its size.

    Naming it in the catalog is the caller's next step, once this has returned.
    """
    if sys.byteorder != "little":
        raise ImageError("namespace images are little-endian only")
    if table.uncompressed():
        raise ImageError("xattrs wait to be compressed: the final checkpoint has not run")
    path = os.path.join(packdir, FILENAME)
    tmp = path + ".tmp"
    slots = _top(table)
    header = _HEADER.pack(_MAGIC, VERSION, _KEEP_XATTRS if table.keep_xattrs else 0, token, *stamp, slots,
                          table.live)
    try:
        with open(tmp, "wb") as f:
            f.write(header + _CRC.pack(crc32(header)))
            for payload in _sections(table, slots):
                f.write(_SECTION.pack(len(payload), crc32(payload)))
                f.write(payload)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        discard(packdir)
        raise
    return size


def _top(table: InodeTable) -> int:
    """One past the highest inode number in use: the slots worth saving."""
    used = len(table.kind.tobytes().rstrip(b"\0"))
    return max(inodes.ROOT + 1, -(-used // table.kind.itemsize))


def _sections(table: InodeTable, slots: int) -> Iterator[bytes | memoryview]:
    """The payloads, one at a time (the largest is built only when its turn comes)."""
    # `kname` names a string only for directories (a regular file's holds its record).
    # The xattr references are `kid` for anything but a directory, then the directories'
    # (`dir_xat`), and name no string where they are IN_CATALOG or IN_RECORD.
    names, kname = _compact(table.names, table.kname[:slots], lambda: table.of_type(stat.S_IFDIR, 0, slots))
    refs, naming = table.xattr_refs(slots)
    xblobs, refs = _compact(table.xblobs, refs, naming)
    dir_xat = dict(zip(table.dir_xat, refs[slots:]))
    columns = {"kname": kname, "kid": refs[:slots]}
    for name in COLUMNS:
        yield memoryview(columns.get(name, getattr(table, name))).cast("B")[:slots * getattr(table, name).itemsize]
    yield memoryview(names.data)
    packed = {d: e.dump() for d, e in table.dirs.items() if type(e) is PackedEntries}
    dicts = {d: e for d, e in table.dirs.items() if type(e) is dict}
    yield marshal.dumps((names.free_lists(), packed, dicts), _MARSHAL_VERSION)
    far = [a.tobytes() for times in (table.atimes, table.ctimes) for a in (times.far, times.spare)]
    yield marshal.dumps((table.rdev, table.target, table.extents, table.kinds, table.wide_nlink, table.wide_size,
                         table.volumes.tobytes(), dir_xat, *far), _MARSHAL_VERSION)
    yield memoryview(xblobs.data)
    yield marshal.dumps(xblobs.free_lists(), _MARSHAL_VERSION)


def _compact(arena: Arena, refs: array, which: Callable[[], bytes] | None = None) -> tuple[Arena, array]:
    """An arena to save, and its references: compacted if more than 1/32 of it is free
    space (deletes free names and values, and a directory that grows from one name to a
    few frees its old strings), so that the next mount starts without it. Compacting
    costs the unmount ~0.5 s per million slots for the names arena and ~0.3 s for the
    xattr arena (measured without FUSE).
    `which` gives Arena.compacted's mask, made only if the arena is compacted."""
    if arena.wasted() <= len(arena.data) // 32:
        return arena, refs
    return arena.compacted(refs, which() if which else None)


def load(packdir: str, token: int, stamp: Stamp, keep_xattrs: bool) -> InodeTable:
    """The table in the image named by `token` and taken at `stamp`, or ImageError saying why it
    cannot be used."""
    try:
        f = open(os.path.join(packdir, FILENAME), "rb")
    except FileNotFoundError:
        raise ImageError("the catalog names an image, but there is none") from None
    with f:
        if os.fstat(f.fileno()).st_size < _HEADER.size + _CRC.size:
            raise ImageError("it is truncated")
        # Mapped, not read: the sections are decoded straight from the page cache, and no
        # copy of them is left in the heap afterwards.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            reader = _Reader(memoryview(m))
            try:
                return _decode(reader, token, stamp, keep_xattrs)
            except Exception as e:
                # Raised again below: this traceback's frames hold views of the mapping,
                # which cannot be unmapped while they live.
                error = str(e) if isinstance(e, ImageError) else f"it does not decode: {e!r}"
            finally:
                reader.view.release()
    raise ImageError(error)


def _decode(r: "_Reader", token: int, stamp: Stamp, keep_xattrs: bool) -> InodeTable:
    head = r.take(_HEADER.size + _CRC.size)
    if head[:len(_MAGIC)] != _MAGIC:
        raise ImageError("it is not a packfs namespace image")
    if _CRC.unpack_from(head, _HEADER.size)[0] != crc32(head[:_HEADER.size]):
        raise ImageError("its header is damaged")
    _, version, flags, got, *taken, slots, live = _HEADER.unpack_from(head)
    if version != VERSION:
        raise ImageError(f"it has version {version}; this packfs reads version {VERSION}")
    if got != token:
        raise ImageError("it is not the image of this catalog (a stale image)")
    if tuple(taken) != tuple(stamp):
        raise ImageError("the catalog has moved on since the image was taken")
    if bool(flags & _KEEP_XATTRS) != keep_xattrs:
        raise ImageError(f"it was written with{'' if flags & _KEEP_XATTRS else 'out'} xattrs_in_memory")
    if sys.byteorder != "little":
        raise ImageError("namespace images are little-endian only")
    table = InodeTable()
    table.keep_xattrs = keep_xattrs
    for name in COLUMNS:
        column = array(getattr(table, name).typecode)
        wider = _WIDER.get(name)
        if wider:  # the length tells which
            payload = r.section()
            for typecode in wider:
                if len(payload) == slots * array(typecode).itemsize:
                    column = array(typecode)
            column.frombytes(r.section_payload(payload, slots * column.itemsize))
        else:
            column.frombytes(r.section(slots * column.itemsize))
        setattr(table, name, column)
    for name in inodes.RUNTIME_COLUMNS:
        setattr(table, name, array(getattr(table, name).typecode, bytes(slots * getattr(table, name).itemsize)))
    names = r.section()
    free, packed, table.dirs = r.unmarshal((dict, dict, dict))
    table.names = _arena(table.names, names, free)
    try:
        table.dirs.update((d, PackedEntries.restore(e)) for d, e in packed.items())
    except (ValueError, TypeError) as e:
        raise ImageError(f"its directory entries do not decode: {e}") from None
    table.rdev, table.target, table.extents, kinds, table.wide_nlink, table.wide_size, volumes, table.dir_xat, *far = \
        r.unmarshal((dict, dict, dict, list, dict, dict, bytes, dict, bytes, bytes, bytes, bytes))
    try:
        table.set_volumes(array("I", volumes))
    except ValueError as e:
        raise ImageError(f"its volume indexes do not decode: {e}") from None
    try:
        for times, (far_times, spare) in zip((table.atimes, table.ctimes), (far[0:2], far[2:4])):
            times.far, times.spare = array("q", far_times), array("I", spare)
    except ValueError as e:
        raise ImageError(f"its far times do not decode: {e}") from None
    try:
        table.set_kinds(kinds)
    except (ValueError, TypeError) as e:
        raise ImageError(f"its kinds do not decode: {e}") from None
    blobs = r.section()
    table.xblobs = _arena(table.xblobs, blobs, *r.unmarshal((dict,)))
    if live != slots - table.kind.count(0):
        raise ImageError("its columns do not agree with its header")
    if r.pos != len(r.view):
        raise ImageError("it has data after its last section")
    table.live = live
    return table


def _arena(like: Arena, data: memoryview, free: dict) -> Arena:
    """An arena of like's kind and grain, restored from its section and free lists."""
    try:
        return type(like).restore(like.grain, data, free)
    except (ValueError, TypeError) as e:
        raise ImageError(f"an arena does not decode: {e}") from None


def take(packdir: str, token: int | None, stamp: Stamp, keep_xattrs: bool) -> InodeTable | None:
    """The table of the catalog's image, or None: no image is named, or it cannot be used
    (a warning says why, and the caller loads the catalog)."""
    if not token:
        return None
    try:
        return load(packdir, token, stamp, keep_xattrs)
    except (ImageError, OSError) as e:
        log.warning("namespace image not used, loading the catalog instead: %s", e)
        return None


def discard(packdir: str) -> None:
    """Remove the image and any partly written one (both are stale once the catalog changes)."""
    for name in (FILENAME, FILENAME + ".tmp"):
        try:
            os.unlink(os.path.join(packdir, name))
        except FileNotFoundError:
            pass


class _Reader:
    """Sections from the mapped image, in order, each checked against its CRC."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.view):
            raise ImageError("it is truncated")
        self.pos += n
        return self.view[self.pos - n:self.pos]

    def section(self, expected: int | None = None) -> memoryview:
        length, crc = _SECTION.unpack(self.take(_SECTION.size))
        payload = self.take(length)
        if crc32(payload) != crc:
            raise ImageError("a section is damaged (CRC mismatch)")
        return self.section_payload(payload, expected)

    @staticmethod
    def section_payload(payload: memoryview, expected: int | None) -> memoryview:
        """A section's payload, if it has the expected length."""
        if expected is not None and len(payload) != expected:
            raise ImageError(f"a section has {len(payload)} bytes where {expected} were expected")
        return payload

    def unmarshal(self, types: tuple[type, ...]) -> tuple:
        try:
            value = marshal.loads(self.section())
        except (ValueError, EOFError, TypeError) as e:
            raise ImageError(f"a section does not decode: {e}") from None
        if len(types) == 1:
            value = (value,)
        if not isinstance(value, tuple) or len(value) != len(types) or \
                not all(isinstance(v, t) for v, t in zip(value, types)):
            raise ImageError("a section holds something unexpected")
        return value
