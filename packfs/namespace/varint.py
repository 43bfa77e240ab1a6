"""LEB128 unsigned integers: seven bits a byte, low first, the top bit set on all but the
last. Small numbers take one byte: an xattr value's length in the xattr arena, the
lengths and counts of the Swift form of Swift's metadata."""
from __future__ import annotations

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def encode(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode(b: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """(the number at pos, the position after it)."""
    n = shift = 0
    while True:
        byte = b[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n, pos
        shift += 7
