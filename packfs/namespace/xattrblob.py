"""The packed form of one inode's xattrs: one string, compressed when that pays.

Plain, a blob is `<u16 name length><u32 value length><name><value>` per xattr. Swift
sets two on every object (its pickled metadata, ~340 B, and that pickle's MD5), and at a
million objects they are the largest thing the inode table holds, so blobs of
XATTR_COMPRESS_MIN to XATTR_COMPRESS_MAX bytes are stored raw-deflated against a preset
dictionary, behind a two-byte prefix that names the form and that no plain blob starts
with (its first field is a name length of at most 255: its second byte is 0):

- `ff ff`: the plain blob, deflated with _XZ_DICT_2 (format 2: Python 2-style pickles);
- `ff fe`: the plain blob, deflated with _XZ_DICT_3 (format 3: Swift's pickles under
  Python 3, ~105-140 B for Swift's ~440 B);
- `ff fd`: the Swift form (format 4). When the first xattr is Swift's metadata, a
  pickle of a dict of bytes that pickling the dict again gives back byte for byte, the
  dict's items are stored instead of the pickle (hex values as the bytes they spell,
  timestamps as 7-byte numbers: deflate's fixed codes spend a byte on every digit),
  and the checksum xattr that follows it, if it is the pickle's MD5, becomes a flag.
  That is deflated with _XZ_DICT_4: ~50 B for Swift's ~440 B. A CRC-32 of the pickle
  is kept, and reading pickles the dict again (protocol 2, as Swift does) and checks
  it, so a pickler that ever wrote other bytes would fail loudly (EIO) rather than give
  Swift a wrong pickle. The layout is in docs/on-disk-format.md. Both ways run in C
  where packfs/swiftmeta/_swiftform.c is built (the same bytes; tests/unit/test_swiftform.py).

Only the blobs' holders decide when to compress (InodeTable.compress_xattrs).
"""
from __future__ import annotations

import errno
import hashlib
import logging
import pickle
import struct
import zlib
from typing import Callable, Iterator

from ..errors import FsError
from ..swiftmeta.swiftpickle import load_metadata
from . import varint
from .arena import COUNTED_MAX_LEN

try:  # the Swift form in C: a decode in the daemon 2.5-4x faster than the Python below
    from ..swiftmeta import _swiftform
except ImportError:  # not built (setup.py makes it optional): the Python below does it
    _swiftform = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_XHEAD = struct.Struct("<HI")
_CRC = struct.Struct("<I")
XATTR_COMPRESS_MIN = 128
# Larger blobs stay plain: deflating one takes the event loop ~1 ms per 32 KiB, and any
# user may set 64 KiB values under many names (a compressor slice of them held the loop
# over 0.4 s). Swift's metadata is a few hundred bytes.
XATTR_COMPRESS_MAX = 64 << 10
XATTRS_MAX = COUNTED_MAX_LEN  # all of one inode's xattrs, packed plain: they are one arena string
SWIFT_METADATA = b"user.swift.metadata"
SWIFT_CHECKSUM = b"user.swift.metadata_checksum"
_PICKLE_PROTOCOL = 2  # Swift's (diskfile.PICKLE_PROTOCOL)
_SUM_DERIVED = 1  # Swift form flag: the checksum xattr follows the metadata and is its MD5

# On-disk format: never change these bytes.
_XZ_DICT_2 = (b"\x13\x00\x00\x00\x00\x00user.swift.metadata\x80\x02}q\x00(X\x04\x00\x00\x00nameq\x01X"
              b"\x0b\x00\x00\x00X-Timestampq\x03X\x0c\x00\x00\x00Content-Typeq\x05X\x18\x00\x00\x00"
              b"application/octet-streamq\x06X\x04\x00\x00\x00ETagq\x07X \x00\x00\x00X\x0e\x00\x00\x00"
              b"Content-Lengthq\x09X\x04\x00\x00\x004096X\x14\x00\x00\x00X-Object-Meta-X-Object-Sysmeta-"
              b"X-Backend-Durable-TimestampX-Static-Large-Objectu.\x00user.swift.metadata_checksum/AUTH_")
_XZ_DICT_3 = _XZ_DICT_2 + (
    b'\x13\x00\xbe\x02\x00\x00user.swift.metadata\x80\x02}q\x00(c_codecs\nencode\nq\x01X\x0b'
    b'\x00\x00\x00X-Timestampq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05h\x01X\x10\x00\x00'
    b'\x001700000000.00000q\x06h\x03\x86q\x07Rq\x08h\x01X\x0c\x00\x00\x00Content-Typeq\th\x03'
    b'\x86q\nRq\x0bh\x01X\x10\x00\x00\x00application/jsonq\x0ch\x03\x86q\rRq\x0eh\x01X\x0e\x00'
    b'\x00\x00Content-Lengthq\x0fh\x03\x86q\x10Rq\x11h\x01X\x01\x00\x00\x000q\x12h\x03\x86q\x13'
    b'Rq\x14h\x01X\x04\x00\x00\x00ETagq\x15h\x03\x86q\x16Rq\x17h\x01X \x00\x00\x00d41d8cd98f00b'
    b'204e9800998ecf8427eq\x18h\x03\x86q\x19Rq\x1ah\x01X\x13\x00\x00\x00X-Object-Meta-Mtimeq'
    b'\x1bh\x03\x86q\x1cRq\x1dh\x01X\x11\x00\x00\x001700000000.000000q\x1eh\x03\x86q\x1fRq h'
    b'\x01X/\x00\x00\x00X-Object-Sysmeta-Container-Update-Override-Etagq!h\x03\x86q"Rq#h\x01X '
    b'\x00\x00\x00d41d8cd98f00b204e9800998ecf8427eq$h\x03\x86q%Rq&h\x01X\x1b\x00\x00\x00X-Backe'
    b"nd-Durable-Timestampq'h\x03\x86q(Rq)h\x01X\x10\x00\x00\x001700000000.00000q*h\x03\x86q+Rq"
    b',h\x01X\x15\x00\x00\x00X-Static-Large-Objectq-h\x03\x86q.Rq/h\x01X\x04\x00\x00\x00Trueq0h'
    b'\x03\x86q1Rq2h\x01X\x10\x00\x00\x00Content-Encodingq3h\x03\x86q4Rq5h\x01X\x04\x00\x00\x00'
    b'gzipq6h\x03\x86q7Rq8h\x01X\x04\x00\x00\x00nameq9h\x03\x86q:Rq;h\x01X\x0e\x00\x00\x00/AUTH'
    b'_test/c/oq<h\x03\x86q=Rq>u.\x1c\x00 \x00\x00\x00user.swift.metadata_checksum8dc4dbc87ee8c'
    b'311a126094e0b08f17a\x13\x00T\x01\x00\x00user.swift.metadata\x80\x02}q\x00(c_codecs\nencod'
    b'e\nq\x01X\x04\x00\x00\x00nameq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05h\x01X\x0e'
    b'\x00\x00\x00/AUTH_test/c/oq\x06h\x03\x86q\x07Rq\x08h\x01X\x0b\x00\x00\x00X-Timestampq\th'
    b'\x03\x86q\nRq\x0bh\x01X\x10\x00\x00\x001700000000.00000q\x0ch\x03\x86q\rRq\x0eh\x01X\x0c'
    b'\x00\x00\x00Content-Typeq\x0fh\x03\x86q\x10Rq\x11h\x01X\x18\x00\x00\x00application/octet-'
    b'streamq\x12h\x03\x86q\x13Rq\x14h\x01X\x04\x00\x00\x00ETagq\x15h\x03\x86q\x16Rq\x17h\x01X '
    b'\x00\x00\x00d41d8cd98f00b204e9800998ecf8427eq\x18h\x03\x86q\x19Rq\x1ah\x01X\x0e\x00\x00'
    b'\x00Content-Lengthq\x1bh\x03\x86q\x1cRq\x1dh\x01X\x04\x00\x00\x004096q\x1eh\x03\x86q\x1fR'
    b'q u.\x1c\x00 \x00\x00\x00user.swift.metadata_checksumbe916345d41757e59c036aecce89a8ce\x13'
    b'\x00\x94\x00\x00\x00user.swift.metadata\x80\x02}q\x00(c_codecs\nencode\nq\x01X\x0b\x00'
    b'\x00\x00X-Timestampq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05h\x01X\x10\x00\x00\x00'
    b'1700000000.00000q\x06h\x03\x86q\x07Rq\x08h\x01X\x04\x00\x00\x00nameq\th\x03\x86q\nRq\x0bh'
    b'\x01X\x0e\x00\x00\x00/AUTH_test/c/oq\x0ch\x03\x86q\rRq\x0eu.\x1c\x00 \x00\x00\x00user.swi'
    b'ft.metadata_checksumf356c9058d05ae8e7f7daea563b76853\x13\x00T\x01\x00\x00user.swift.metad'
    b'ata\x80\x02}q\x00(c_codecs\nencode\nq\x01X\x0b\x00\x00\x00X-Timestampq\x02X\x06\x00\x00'
    b'\x00latin1q\x03\x86q\x04Rq\x05h\x01X\x10\x00\x00\x001700000000.00000q\x06h\x03\x86q\x07Rq'
    b'\x08h\x01X\x0c\x00\x00\x00Content-Typeq\th\x03\x86q\nRq\x0bh\x01X\x18\x00\x00\x00applicat'
    b'ion/octet-streamq\x0ch\x03\x86q\rRq\x0eh\x01X\x0e\x00\x00\x00Content-Lengthq\x0fh\x03\x86'
    b'q\x10Rq\x11h\x01X\x04\x00\x00\x004096q\x12h\x03\x86q\x13Rq\x14h\x01X\x04\x00\x00\x00ETagq'
    b'\x15h\x03\x86q\x16Rq\x17h\x01X \x00\x00\x00d41d8cd98f00b204e9800998ecf8427eq\x18h\x03\x86'
    b'q\x19Rq\x1ah\x01X\x04\x00\x00\x00nameq\x1bh\x03\x86q\x1cRq\x1dh\x01X\x0e\x00\x00\x00/AUTH'
    b'_test/c/oq\x1eh\x03\x86q\x1fRq u.\x1c\x00 \x00\x00\x00user.swift.metadata_checksum17abe44'
    b'10846e804e7105a0ebf261886')


# How the Swift form keeps a value, in the low two bits of its length: deflate's fixed
# codes, all that pays for ~60 B, spend a byte on each hex digit or decimal digit.
_RAW, _HEX, _STAMP = 0, 1, 2  # as it is; lowercase hex as its bytes; `<10>.<5>` digits as 7 bytes
_HEX_DIGITS = b"0123456789abcdef"
_STAMP_INT = struct.Struct(">Q")


def _value(v: bytes) -> bytes:
    if len(v) == 16 and v[10:11] == b"." and v[:10].isdigit() and v[11:].isdigit():
        return varint.encode(7 << 2 | _STAMP) + _STAMP_INT.pack(int(v[:10] + v[11:]))[1:]
    if v and not len(v) % 2 and not v.translate(None, _HEX_DIGITS):
        return varint.encode(len(v) // 2 << 2 | _HEX) + bytes.fromhex(v.decode())
    return varint.encode(len(v) << 2 | _RAW) + v


def _read_value(b: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = varint.decode(b, pos)
    kind, n = n & 3, n >> 2
    v, pos = b[pos:pos + n], pos + n
    if kind == _HEX:
        return v.hex().encode(), pos
    if kind == _STAMP:
        digits = b"%015d" % _STAMP_INT.unpack(b"\0" + v)[0]
        return digits[:10] + b"." + digits[10:], pos
    return v, pos


def _items(d: dict[bytes, bytes]) -> bytes:
    """A dict of bytes as the Swift form stores it."""
    return varint.encode(len(d)) + b"".join([varint.encode(len(k)) + k + _value(v) for k, v in d.items()])


def _read_items(b: bytes, pos: int) -> tuple[dict[bytes, bytes], int]:
    count, pos = varint.decode(b, pos)
    d = {}
    for _ in range(count):
        n, pos = varint.decode(b, pos)
        k, pos = b[pos:pos + n], pos + n
        d[k], pos = _read_value(b, pos)
    return d, pos


# The Swift form's dictionary: the items of what Swift writes most, the commonest last
# (deflate codes near distances in fewer bits): other keys Swift and its middlewares set
# (a POST's .meta, erasure coding, SLO, encryption), a tombstone, the order a direct
# diskfile writer uses, and an object server's PUT.
_XZ_DICT_4 = b"".join(_items(d) for d in (
    {b"X-Object-Transient-Sysmeta-Crypto-Meta": b"", b"X-Object-Sysmeta-Crypto-Body-Meta": b"",
     b"X-Object-Sysmeta-Ec-Frag-Index": b"0", b"X-Object-Sysmeta-Ec-Etag": b"d41d8cd98f00b204e9800998ecf8427e",
     b"X-Object-Sysmeta-Ec-Content-Length": b"0", b"X-Object-Sysmeta-Ec-Scheme": b"liberasurecode_rs_vand 4+2",
     b"X-Object-Sysmeta-Ec-Segment-Size": b"1048576", b"X-Delete-At": b"1700000000",
     b"X-Object-Sysmeta-Slo-Etag": b"", b"X-Object-Sysmeta-Slo-Size": b"0", b"X-Static-Large-Object": b"True",
     b"X-Object-Sysmeta-Container-Update-Override-Etag": b"d41d8cd98f00b204e9800998ecf8427e",
     b"X-Backend-Durable-Timestamp": b"1700000000.00000", b"Content-Encoding": b"gzip",
     b"Content-Disposition": b"attachment", b"X-Object-Meta-Mtime": b"1700000000.000000"},
    {b"X-Timestamp": b"1700000000.00000", b"name": b"/AUTH_test/c/o"},
    {b"name": b"/AUTH_test/c/o", b"X-Timestamp": b"1700000000.00000", b"Content-Type": b"application/octet-stream",
     b"ETag": b"d41d8cd98f00b204e9800998ecf8427e", b"Content-Length": b"4096"},
    {b"X-Timestamp": b"1700000000.00000", b"Content-Type": b"application/octet-stream", b"Content-Length": b"4096",
     b"ETag": b"d41d8cd98f00b204e9800998ecf8427e", b"name": b"/AUTH_test/c/o"},
))
_XZ_DICTS = {b"\xff\xff": _XZ_DICT_2, b"\xff\xfe": _XZ_DICT_3}
_SWIFT_PREFIX = b"\xff\xfd"  # what is compressed now: the Swift form, with _XZ_DICT_4, where it applies
_DEFLATED_PREFIX = b"\xff\xfe"  # any other blob: deflated whole, with _XZ_DICT_3
_PREFIXES = (*_XZ_DICTS, _SWIFT_PREFIX)
COMPRESSED_PREFIXES = _PREFIXES  # (named for the fuse shim's C, which decodes the Swift form)
SWIFT_FORM_PREFIX = _SWIFT_PREFIX


def _swift_items(meta: bytes) -> bytes | None:
    """The items of the dict a pickle of Swift's metadata holds, as the Swift form keeps
    them, if it is a dict of bytes that they pickle back to byte for byte (checked)."""
    if _swiftform is not None:
        return _swiftform.swift_items(meta)
    d = load_metadata(meta)
    if d is None:  # anything else: it stays a plain value
        return None
    items = _items(d)
    if pickle.dumps(_read_items(items, 0)[0], _PICKLE_PROTOCOL) != meta:
        return None
    return items


def _md5_hex(data: bytes) -> bytes:
    return _swiftform.md5_hexdigest(data) if _swiftform is not None else hashlib.md5(data).hexdigest().encode()


def swift_form_decoder() -> tuple[Callable[[memoryview, bytes], bytes], bytes] | None:
    """_swiftform.plain_blob and the dictionary the Swift form is deflated against, for C
    that decodes the form without running Python code (the fuse shim); None if not built."""
    return (_swiftform.plain_blob, _XZ_DICT_4) if _swiftform is not None else None


def codec() -> str:
    """Which code reads and writes the Swift form: `c` (packfs/swiftmeta/_swiftform.c) or `python`."""
    return "c" if _swiftform is not None else "python"


def pack_xattrs(xattrs: dict[bytes, bytes] | None, compress: bool = True) -> bytes | None:
    if not xattrs:
        return None
    blob = b"".join([_XHEAD.pack(len(k), len(v)) + k + v for k, v in xattrs.items()])
    return compressed(blob) if compress else blob


def packed_size(xattrs: dict[bytes, bytes]) -> int:
    """The plain packed size of a set of xattrs (at most XATTRS_MAX)."""
    return sum(_XHEAD.size + len(k) + len(v) for k, v in xattrs.items())


def is_compressed(blob: bytes) -> bool:
    return bytes(blob[:2]) in _PREFIXES


def compressible(blob: bytes) -> bool:
    """A plain packed blob big enough to try compressing."""
    return XATTR_COMPRESS_MIN <= len(blob) <= XATTR_COMPRESS_MAX and not is_compressed(blob)


def _deflate(data: bytes, zdict: bytes) -> bytes:
    """Raw deflate against zdict. memLevel 1: a blob is at most a few KiB, and zlib's
    default (8-9) sets up a 128 KiB hash table per call, which was most of the cost
    (measured: 64 against 6.4 us for Swift's metadata, the same 58 B out; whole blobs
    ~1.5% bigger). Any memLevel inflates the same way."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15, 1, zlib.Z_DEFAULT_STRATEGY, zdict)
    return c.compress(data) + c.flush()


def _swift_form(blob: bytes) -> bytes | None:
    """The Swift form's payload for a plain blob, if its first xattr is Swift's metadata."""
    it = iter_xattrs(blob)
    name, a, end = next(it)
    if name != SWIFT_METADATA:
        return None
    meta = blob[a:end]
    items = _swift_items(meta)
    if items is None:
        return None
    flags = 0
    following = next(it, None)
    if following is not None and following[0] == SWIFT_CHECKSUM:
        _, s, e = following
        if blob[s:e] == _md5_hex(meta):
            flags, end = _SUM_DERIVED, e
    return _CRC.pack(zlib.crc32(meta)) + items + bytes((flags,)) + blob[end:]


def compressed(blob: bytes) -> bytes:
    """A plain packed blob, compressed if that makes it smaller (~55 us for Swift's
    metadata: the pickle is read and made again to check the Swift form)."""
    if not compressible(blob):
        return blob
    swift = _swift_form(blob)
    packed = _SWIFT_PREFIX + _deflate(swift, _XZ_DICT_4) if swift else _DEFLATED_PREFIX + _deflate(blob, _XZ_DICT_3)
    return packed if len(packed) < len(blob) else blob


def _from_swift_form(payload: bytes) -> bytes:
    """The plain blob a Swift form payload keeps: the pickle is made again and checked
    (_swiftform.plain_blob does it in C, the inflating too)."""
    (crc,) = _CRC.unpack_from(payload)
    d, pos = _read_items(payload, _CRC.size)
    meta = pickle.dumps(d, _PICKLE_PROTOCOL)
    if zlib.crc32(meta) != crc:
        raise ValueError(f"the pickle made again has CRC {zlib.crc32(meta):08x}, stored {crc:08x}: "
                         "Swift's metadata pickles differently here than when it was stored")
    blob = _XHEAD.pack(len(SWIFT_METADATA), len(meta)) + SWIFT_METADATA + meta
    if payload[pos] & _SUM_DERIVED:
        blob += _XHEAD.pack(len(SWIFT_CHECKSUM), 32) + SWIFT_CHECKSUM + hashlib.md5(meta).hexdigest().encode()
    return blob + payload[pos + 1:]


def plain(blob: bytes) -> bytes:
    """A packed xattr blob, decompressed if it was stored compressed; EIO (logged) if it
    does not decode."""
    prefix = bytes(blob[:2])
    if prefix not in _PREFIXES:
        return blob
    try:
        if prefix == _SWIFT_PREFIX and _swiftform is not None:
            return _swiftform.plain_blob(memoryview(blob)[2:], _XZ_DICT_4)
        if prefix == _SWIFT_PREFIX:
            return _from_swift_form(zlib.decompressobj(-15, _XZ_DICT_4).decompress(memoryview(blob)[2:]))
        return zlib.decompressobj(-15, _XZ_DICTS[prefix]).decompress(memoryview(blob)[2:])
    except (zlib.error, ValueError, IndexError, struct.error) as e:
        log.error("stored xattrs do not decode: %s", e)
        raise FsError(errno.EIO, f"stored xattrs do not decode: {e}") from None


def iter_xattrs(blob: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(name, value start, value end) for each xattr in a plain packed blob."""
    pos = 0
    while pos < len(blob):
        nlen, vlen = _XHEAD.unpack_from(blob, pos)
        pos += _XHEAD.size
        yield blob[pos:pos + nlen], pos + nlen, pos + nlen + vlen
        pos += nlen + vlen


def unpack_xattrs(blob: bytes | None) -> dict[bytes, bytes] | None:
    if not blob:
        return None
    blob = plain(blob)
    return {name: blob[a:b] for name, a, b in iter_xattrs(blob)}
