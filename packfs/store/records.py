"""The self-describing record format of the volumes.

Every record starts on a BLOCK boundary with a fixed header, followed by its payload,
and occupies whole blocks, so punching a dead record returns its space to the disk:

    magic 4s | type B | flags B | reserved H | seq Q | ino Q | offset Q |
    length I | payload_crc I | pack_id I | header_crc I          (48 bytes)

`header_crc` covers the 44 bytes before it; `payload_crc` covers the payload. `pack_id`
ties a record to its pack, so bytes copied from another pack are never taken for ours.
Both CRCs are zlib's CRC-32, computed by zlib-ng: 68 against 282 us per MiB here, and
it is paid on the event loop for every byte written and read.
DATA records carry file contents (ino, offset in the file); META records carry a
journal entry (see journal.py).

A DATA record may also carry its file's xattrs in the padding of its last block, where
they cost no disk space and no IO of their own (format 6): flag XATTRS is set, `reserved`
is the blob's length, and the blob (xattrblob's packed form) follows the payload, then
its CRC-32. A Swift object's ~60 B of compressed metadata fits beside its data unless the
data ends within ~70 B of a block's end; the reader of a cold object then gets both in
one disk read, and the inode table keeps only that they are there (xattrstore.IN_RECORD).
`length` and `payload_crc` are the payload's alone, so a reader of the data never sees
the trailer.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence, Union

from zlib_ng.zlib_ng import crc32

MAGIC = b"PKR1"
BLOCK = 4096
HEADER = struct.Struct("<4sBBHQQQIII")
_CRC = struct.Struct("<I")
HEADER_SIZE = HEADER.size + _CRC.size  # 48
_ZEROS = memoryview(bytes(BLOCK))  # padding: shared, never written to

Payload = Union[bytes, bytearray, memoryview]

DATA = 1
META = 2
TYPES = {DATA: "data", META: "meta"}
XATTRS = 1  # flag: the padding holds the file's xattrs (see above)
TRAILER_MAX = 0xFFFF  # bytes of xattrs a trailer holds, at most (`reserved` is a u16)


class RecordError(Exception):
    """A record that is torn, corrupted or not ours."""


@dataclass(frozen=True, slots=True)
class Header:
    rtype: int
    seq: int
    ino: int
    offset: int
    length: int
    payload_crc: int
    trailer: int = 0  # bytes of xattrs after the payload (flag XATTRS), 0 for none

    @property
    def footprint(self) -> int:
        return footprint(self.length)


def footprint(payload_length: int) -> int:
    """Bytes a record occupies on disk: header plus payload, rounded up to whole blocks."""
    return -(-(HEADER_SIZE + payload_length) // BLOCK) * BLOCK


def trailer_fits(payload_length: int, xattrs_length: int) -> bool:
    """Whether xattrs of this many bytes fit in the padding of a record of this payload."""
    return 0 < xattrs_length <= TRAILER_MAX and \
        HEADER_SIZE + payload_length + xattrs_length + _CRC.size <= footprint(payload_length)


def encode(rtype: int, seq: int, ino: int, offset: int, parts: Sequence[Payload], pack_id: int,
           trailer: bytes = b"") -> list[Payload]:
    """The record as buffers to write back to back: its header, the payload's parts
    themselves (not copied: the log writer hands them to one pwritev), and the padding to
    its footprint, which holds `trailer` (the file's packed xattrs, which the caller has
    checked fit: trailer_fits). Joining the parts here cost a copy of every byte written
    on the event loop (~10 us of its CPU per 64 KiB write in fio's stream). The parts must
    not change until written."""
    n = crc = 0
    for p in parts:
        n += len(p)
        crc = crc32(p, crc)
    flags = XATTRS if trailer else 0
    head = HEADER.pack(MAGIC, rtype, flags, len(trailer), seq, ino, offset, n, crc, pack_id)
    out = [head + _CRC.pack(crc32(head)), *parts]
    pad = footprint(n) - HEADER_SIZE - n
    if trailer:
        assert trailer_fits(n, len(trailer)), "a trailer that does not fit the padding"
        out.append(trailer + _CRC.pack(crc32(trailer)))
        pad -= len(trailer) + _CRC.size
    if pad:
        out.append(_ZEROS[:pad])
    return out


def decode_header(buf: bytes, pack_id: int) -> Header:
    if len(buf) < HEADER_SIZE:
        raise RecordError("short header")
    head = buf[: HEADER.size]
    magic, rtype, flags, reserved, seq, ino, offset, length, pcrc, pid = HEADER.unpack(head)
    if magic != MAGIC:
        raise RecordError("bad magic")
    if _CRC.unpack_from(buf, HEADER.size)[0] != crc32(head):
        raise RecordError("header checksum mismatch")
    if pid != pack_id:
        raise RecordError("record of another pack")
    if rtype not in TYPES:
        raise RecordError(f"unknown record type {rtype}")
    return Header(rtype, seq, ino, offset, length, pcrc, reserved if flags & XATTRS else 0)


def check_payload(header: Header, payload: bytes) -> None:
    if len(payload) != header.length:
        raise RecordError("short payload")
    if crc32(payload) != header.payload_crc:
        raise RecordError("payload checksum mismatch")


def trailer_of(header: Header, block: Payload) -> bytes:
    """The xattrs a DATA record carries after its payload, checked; block holds the record
    from its start at least to the trailer's end."""
    if not header.trailer:
        raise RecordError("no xattrs in the record")
    at = HEADER_SIZE + header.length
    end = at + header.trailer
    if len(block) < end + _CRC.size:
        raise RecordError("short trailer")
    blob = bytes(block[at:end])
    if _CRC.unpack_from(block, end)[0] != crc32(blob):
        raise RecordError("xattrs checksum mismatch")
    return blob
