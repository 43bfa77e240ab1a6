"""The entries of a directory with several names, packed: in one string, or in one
bytearray and one array.

A directory with a few names (most Swift suffix directories that have more than one
hash, hash directories with a .data and a .meta) keeps them as one short string
(`pack_small`, at most SMALL_MAX bytes) in the inode table's names arena: about 300 B
less per directory than the objects below, which at a million objects are ~100,000
directories. Past that, the entries are a PackedEntries.

A Swift partition directory holds up to 4,096 three-character suffix directories. As a
dict, each entry costs about 70 B (a slot of the hash table, and a boxed inode number of
32 B); packed, it costs its name, one separator and a u32. A lookup is one `find` over
the packed names, a C loop over a few KiB (up to 8 us for 4,096 suffixes), and the entry's
index is its offset divided by the names' common length, while they all have one
(Swift's suffixes, and its hashes); otherwise a `count` of the separators before it,
several times slower. Past PACKED_MAX bytes of names the table turns a directory's
entries into a dict (see InodeTable.set_child).
"""
from __future__ import annotations

import binascii
import struct
from array import array
from typing import Iterable

SEP = b"/"  # no name contains it
PACKED_MAX = 16 << 10  # bytes of packed names: 4,096 suffixes of three characters fit
SMALL_MAX = 256  # bytes of a directory's entries kept as one string: five Swift hashes fit
_INO = struct.Struct("<I")
_HEX = b"0123456789abcdef"
_HEX_MARK = b"\0"  # no name contains it
# A Swift file name, `<10 digits>.<5 digits><ext>`: its timestamp as a 7-byte number
# (15 digits < 2^56), then the extension's index, behind a SEP (no name contains it).
_STAMP_MARK = SEP
_STAMP_EXTS = (b".data", b".meta", b".ts")
_STAMP = struct.Struct(">Q")


def stored_name(name: bytes) -> bytes:
    """How a directory's one name is kept in the arena: a name of lowercase hex digits
    (a Swift hash directory's 32) as its bytes behind a NUL (17 B), a Swift timestamp
    name (`1732451234.56789.data`, 21 B) as its number and extension behind a SEP (9 B),
    any other as it is."""
    if name[10:11] == b"." and name[16:17] == b"." and name[:10].isdigit() and name[11:16].isdigit():
        ext = name[16:]
        if ext in _STAMP_EXTS:
            return _STAMP_MARK + _STAMP.pack(int(name[:10] + name[11:16]))[1:] + bytes((_STAMP_EXTS.index(ext),))
        return name
    if len(name) % 2 or not name or name.translate(None, _HEX):
        return name
    return _HEX_MARK + binascii.unhexlify(name)


def name_of(stored: bytes) -> bytes:
    """The name a `stored_name` string keeps."""
    mark = stored[:1]
    if mark == _HEX_MARK:
        return stored[1:].hex().encode()
    if mark == _STAMP_MARK:
        digits = b"%015d" % _STAMP.unpack(b"\0" + stored[1:8])[0]
        return digits[:10] + b"." + digits[10:] + _STAMP_EXTS[stored[8]]
    return stored


def pack_small(items: list[tuple[bytes, int]]) -> bytes | None:
    """Entries as one string, `<u8 count><u32 ino * count>/name/name/.../`, or None if that
    is longer than SMALL_MAX. Inode numbers come first: they may hold any byte, names
    anything but SEP."""
    size = 2 + sum(5 + len(name) for name, _ in items)
    if size > SMALL_MAX:
        return None
    inos = b"".join([_INO.pack(ino) for _, ino in items])
    return bytes((len(items),)) + inos + SEP + SEP.join([name for name, _ in items]) + SEP


def small_get(packed: bytes, name: bytes) -> int | None:
    """The inode a `pack_small` string gives `name`, or None."""
    start = 1 + 4 * packed[0]
    pos = packed.find(SEP + name + SEP, start)
    if pos < 0:
        return None
    return _INO.unpack_from(packed, 1 + 4 * packed.count(SEP, start, pos))[0]


def small_items(packed: bytes) -> list[tuple[bytes, int]]:
    """The (name, inode) pairs of a `pack_small` string, in order."""
    start = 1 + 4 * packed[0]
    return list(zip(packed[start + 1:-1].split(SEP), array("I", packed[1:start])))


class PackedEntries:
    """(name, inode) pairs in the order they were added; the subset of a dict's API the
    inode table uses, so a directory's entries are one or the other."""

    __slots__ = ("names", "inos", "width")

    def __init__(self, items: Iterable[tuple[bytes, int]] = ()) -> None:
        self.names = bytearray(SEP)  # /name/name/.../
        self.inos = array("I")
        self.width = 0  # each name's length + 1 while all have the same length, else 0
        for name, ino in items:
            self[name] = ino

    def _find(self, name: bytes) -> tuple[int, int]:
        """(index, offset of the separator before it), or (-1, -1)."""
        pos = self.names.find(SEP + name + SEP)
        if pos < 0:
            return -1, -1
        return (pos // self.width if self.width else self.names.count(SEP, 0, pos)), pos

    def get(self, name: bytes, default: int | None = None) -> int | None:
        i, _ = self._find(name)
        return default if i < 0 else self.inos[i]

    def __setitem__(self, name: bytes, ino: int) -> None:
        i, _ = self._find(name)
        if i >= 0:
            self.inos[i] = ino
        else:
            self.append(name, ino)

    def append(self, name: bytes, ino: int) -> None:
        """Add a name not present (a catalog load: its names are unique)."""
        if not self.inos:
            self.width = len(name) + 1
        elif self.width != len(name) + 1:
            self.width = 0
        self.names += name
        self.names += SEP
        self.inos.append(ino)

    def pop(self, name: bytes, default: int | None = None) -> int | None:
        i, pos = self._find(name)
        if i < 0:
            return default
        del self.names[pos + 1:pos + 2 + len(name)]
        return self.inos.pop(i)

    def items(self) -> list[tuple[bytes, int]]:
        if not self.inos:
            return []
        return list(zip(bytes(self.names[1:-1]).split(SEP), self.inos))

    def __len__(self) -> int:
        return len(self.inos)

    def nbytes(self) -> int:
        return len(self.names)

    def dump(self) -> tuple[bytes, bytes]:
        """A marshal-friendly form (for the namespace image)."""
        return bytes(self.names), self.inos.tobytes()

    @classmethod
    def restore(cls, dumped: tuple[bytes, bytes]) -> "PackedEntries":
        names, inos = dumped
        packed = cls()
        packed.names = bytearray(names)
        packed.inos = array("I", inos)
        if names[:1] != SEP or names[-1:] != SEP or names.count(SEP) != len(packed.inos) + 1:
            raise ValueError("packed directory entries do not agree with their inode numbers")
        lengths = {len(n) for n in bytes(names[1:-1]).split(SEP)} if packed.inos else set()
        packed.width = lengths.pop() + 1 if len(lengths) == 1 else 0
        return packed
