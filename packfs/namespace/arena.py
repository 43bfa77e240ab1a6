"""Byte strings packed back to back in one bytearray, each named by a nonzero integer.

At millions of inodes, a name or an xattr blob kept as a `bytes` object costs 33 B of
object header, a pointer, and malloc's rounding on top of its own bytes (a 32-character
Swift hash directory name: 65 B for 32). In an arena it costs its bytes, rounded up to
the arena's grain, plus the 8 B reference the caller keeps in an `array` column.

A reference is `offset << LEN_BITS | length`; 0 means no string, so empty strings are not
stored. Freed space is kept in one free list per size class (the length in grains) and
reused by the next string of that class, last freed first. Swift's names and metadata
come in a few sizes (32-character hashes, 21-character timestamps, ~110 B of compressed
metadata), so the space stays reused under churn. An arena never shrinks or moves a
string; `compacted` makes a copy without the free space, with which the caller replaces
it and its references (the namespace image is written from one, and the inode table
replaces its xattr arena with one once the free space outweighs the values).
"""
from __future__ import annotations

import itertools
import operator
from array import array
from typing import Callable

from . import varint

LEN_BITS = 24
MAX_LEN = (1 << LEN_BITS) - 1
_LEN_MASK = MAX_LEN
_ZEROS = bytes(256)  # padding up to a grain (grains are at most this big)


class Arena:
    """The strings, and the free space between them."""

    def __init__(self, grain: int = 1) -> None:
        assert 0 < grain <= len(_ZEROS)
        self.grain = grain
        self.data = bytearray()
        self.free: dict[int, array] = {}  # size class -> offsets of free runs of that size
        self.used = 0  # bytes of live strings, their rounding included

    def put(self, value: bytes) -> int:
        """Store a string of 1..MAX_LEN bytes; its reference."""
        n = len(value)
        if not 0 < n <= MAX_LEN:
            raise ValueError(f"an arena string has 1 to {MAX_LEN} bytes, not {n}")
        size = -(-n // self.grain)
        spare = self.free.get(size)
        if not spare:
            return self._append(value)
        off = spare.pop()
        self.data[off:off + n] = value
        self.used += size * self.grain
        return off << LEN_BITS | n

    def append(self, value: bytes) -> int:
        """Store a string at the end, not in freed space: `put`'s way when no space of its
        size is free, and the fast path of a bulk load (1..MAX_LEN bytes: the caller's promise)."""
        return self._append(value)

    def _append(self, value: bytes) -> int:
        off = len(self.data)
        n = len(value)
        self.data += value
        pad = -n % self.grain
        if pad:
            self.data += _ZEROS[:pad]
        self.used += n + pad
        return off << LEN_BITS | n

    def adder(self) -> Callable[[bytes], int]:
        """The fastest way to store many strings (a bulk load): `append` while no space is
        free, else `put`."""
        return self.put if self.free else self.append

    def get(self, ref: int) -> bytes:
        off = ref >> LEN_BITS
        return bytes(self.data[off:off + (ref & _LEN_MASK)])

    def equals(self, ref: int, value: bytes) -> bool:
        """Whether the string `ref` names is `value` (without making a bytes object of it)."""
        n = ref & _LEN_MASK
        if n != len(value):
            return False
        off = ref >> LEN_BITS
        return self.data[off:off + n] == value

    def release(self, ref: int) -> None:
        """Free a string's space for the next string of its size class; 0 is ignored."""
        if ref:
            size = -(-(ref & _LEN_MASK) // self.grain)
            spare = self.free.get(size)
            if spare is None:
                spare = self.free[size] = array("q")
            spare.append(ref >> LEN_BITS)
            self.used -= size * self.grain

    def wasted(self) -> int:
        """Bytes of freed space not yet reused."""
        return len(self.data) - self.used

    def compacted(self, refs: array, which: bytes | None = None) -> tuple["Arena", array]:
        """A copy of the strings `refs` names, back to back with no free space, and the
        references into it in the same order (0 stays 0). Each string must be named once.
        With `which`, only the references where it is nonzero name strings: the others
        are kept as they are."""
        new, out = type(self)(self.grain), array(refs.typecode, refs)
        append, data, span = new.append, self.data, self._span
        named = refs if which is None else map(operator.and_, which, map(bool, refs))
        for i in itertools.compress(range(len(refs)), named):
            off, n = span(refs[i])
            out[i] = append(data[off:off + n])
        return new, out

    def _span(self, ref: int) -> tuple[int, int]:
        """(offset, length) of the string `ref` names."""
        return ref >> LEN_BITS, ref & _LEN_MASK

    def free_lists(self) -> dict[int, bytes]:
        """The free lists in a marshal-friendly form (for the namespace image)."""
        return {size: offsets.tobytes() for size, offsets in self.free.items() if offsets}

    @classmethod
    def restore(cls, grain: int, data: bytes | memoryview, free: dict[int, bytes]) -> "Arena":
        """An arena from its saved bytes and free lists."""
        arena = cls(grain)
        arena.data = bytearray(data)
        arena.free = {size: array("q", offsets) for size, offsets in free.items()}
        held = sum(size * grain * len(offsets) for size, offsets in arena.free.items())
        if held > len(arena.data) or any(o < 0 or o + size * grain > len(arena.data)
                                         for size, offsets in arena.free.items() for o in offsets):
            raise ValueError("a free list points outside the arena")
        arena.used = len(arena.data) - held
        return arena


class CountedArena(Arena):
    """An arena whose strings carry their length, so that a reference is only where one
    starts: its offset in grains, plus one (0 is no string). At a grain of 8 that is a
    u32 for 32 GiB of strings, half of `Arena`'s reference. The xattr arena: every inode
    has a reference (`xat`), and a Swift object is three inodes.

    The length is a LEB128 prefix: one byte up to 127 (Swift's compressed metadata,
    ~55-65 B), and mostly taken from the padding up to the next grain. A finer grain
    pads less but puts values in more size classes, and a freed run is reused only by a
    value of its class: 20,000 objects of Swift metadata took 60.9 B each at a grain of
    2 against 64 B at 8, but after 20 rounds of replacing a tenth of them (longer names
    each round) 83.3 B against 64 B.

    The first RESERVED_REFS grains are never a string's, so references 1 and 2 name none:
    their holder may give them meanings of its own (the inode table's IN_CATALOG and
    IN_RECORD).
    """

    def __init__(self, grain: int = 1) -> None:
        super().__init__(grain)
        self.data += _ZEROS[:grain * RESERVED_REFS]
        self.used += grain * RESERVED_REFS

    def put(self, value: bytes) -> int:
        if not 0 < len(value) <= COUNTED_MAX_LEN:
            raise ValueError(f"an arena string has 1 to {COUNTED_MAX_LEN} bytes, not {len(value)}")
        return self._counted_ref(super().put(varint.encode(len(value)) + value))

    def append(self, value: bytes) -> int:
        return self._counted_ref(self._append(varint.encode(len(value)) + value))

    def _counted_ref(self, ref: int) -> int:
        return (ref >> LEN_BITS) // self.grain + 1

    def _span(self, ref: int) -> tuple[int, int]:
        """(offset, length) of the string `ref` names, its prefix left out."""
        n, off = varint.decode(self.data, (ref - 1) * self.grain)
        return off, n

    def get(self, ref: int) -> bytes:
        off, n = self._span(ref)
        return bytes(self.data[off:off + n])

    def equals(self, ref: int, value: bytes) -> bool:
        off, n = self._span(ref)
        return n == len(value) and self.data[off:off + n] == value

    def release(self, ref: int) -> None:
        if ref:
            start = (ref - 1) * self.grain
            off, n = self._span(ref)
            super().release(start << LEN_BITS | (off - start + n))


RESERVED_REFS = 2  # CountedArena references that name no string (see there)
COUNTED_MAX_LEN = MAX_LEN - 4  # a string this long has a 4-byte prefix: the whole fits an Arena string
