"""The volume record format: encode/decode, checksums, torn and foreign records."""
from __future__ import annotations

import pytest

from packfs.store import records

PACK = 0x1234ABCD


@pytest.mark.parametrize("payload", [b"", b"x", b"y" * (4096 - 48), b"z" * (4096 - 47), bytes(range(256)) * 4000])
def test_round_trip_and_block_alignment(payload):
    raw = b"".join(records.encode(records.DATA, 77, 42, 1 << 40, [payload], PACK))
    assert len(raw) % records.BLOCK == 0
    assert len(raw) == records.footprint(len(payload)) >= records.HEADER_SIZE + len(payload)
    h = records.decode_header(raw, PACK)
    assert (h.rtype, h.seq, h.ino, h.offset, h.length) == (records.DATA, 77, 42, 1 << 40, len(payload))
    assert h.footprint == len(raw)
    body = raw[records.HEADER_SIZE:records.HEADER_SIZE + h.length]
    assert body == payload
    records.check_payload(h, body)
    # Padding is zeros.
    assert raw[records.HEADER_SIZE + len(payload):] == bytes(len(raw) - records.HEADER_SIZE - len(payload))


def test_footprints():
    assert records.HEADER_SIZE == 48
    assert records.footprint(0) == 4096
    assert records.footprint(4048) == 4096
    assert records.footprint(4049) == 8192
    assert records.footprint(65536) == 69632


def test_meta_type():
    raw = b"".join(records.encode(records.META, 1, 0, 8192, [b"meta"], PACK))
    assert records.decode_header(raw, PACK).rtype == records.META


def test_payload_crc_mismatch():
    raw = bytearray(b"".join(records.encode(records.DATA, 1, 2, 0, [b"hello world"], PACK)))
    raw[records.HEADER_SIZE + 3] ^= 0x40
    h = records.decode_header(bytes(raw), PACK)  # the header is still fine
    with pytest.raises(records.RecordError, match="checksum"):
        records.check_payload(h, bytes(raw[records.HEADER_SIZE:records.HEADER_SIZE + h.length]))


def test_short_payload():
    raw = b"".join(records.encode(records.DATA, 1, 2, 0, [b"hello world"], PACK))
    h = records.decode_header(raw, PACK)
    with pytest.raises(records.RecordError):
        records.check_payload(h, raw[records.HEADER_SIZE:records.HEADER_SIZE + 5])


@pytest.mark.parametrize("pos", range(0, 48, 3))
def test_header_bit_flip_detected(pos):
    raw = bytearray(b"".join(records.encode(records.DATA, 5, 6, 7, [b"payload"], PACK)))
    raw[pos] ^= 0x01
    with pytest.raises(records.RecordError):
        records.decode_header(bytes(raw), PACK)


@pytest.mark.parametrize("cut", [0, 1, 20, 44, 47])
def test_torn_header(cut):
    raw = b"".join(records.encode(records.DATA, 5, 6, 7, [b"payload"], PACK))
    with pytest.raises(records.RecordError):
        records.decode_header(raw[:cut], PACK)


def test_zeros_are_not_a_record():
    with pytest.raises(records.RecordError, match="magic"):
        records.decode_header(bytes(4096), PACK)


def test_record_of_another_pack():
    raw = b"".join(records.encode(records.DATA, 1, 2, 3, [b"x"], PACK + 1))
    with pytest.raises(records.RecordError, match="another pack"):
        records.decode_header(raw, PACK)


def test_unknown_type():
    raw = b"".join(records.encode(99, 1, 2, 3, [b"x"], PACK))
    with pytest.raises(records.RecordError, match="type"):
        records.decode_header(raw, PACK)


def test_parts_make_the_same_record_as_their_join():
    parts = [b"abc", memoryview(b"0123456789")[2:7], bytearray(b"\x00\xff" * 3000), b""]
    raw = b"".join(records.encode(records.DATA, 3, 4, 5, parts, PACK))
    assert raw == b"".join(records.encode(records.DATA, 3, 4, 5, [b"".join(parts)], PACK))
    h = records.decode_header(raw, PACK)
    records.check_payload(h, raw[records.HEADER_SIZE:records.HEADER_SIZE + h.length])


def test_the_payload_is_passed_by_reference_not_copied():
    payload = bytes(65536)
    out = records.encode(records.DATA, 1, 2, 0, [payload], PACK)
    assert out[1] is payload
    assert sum(map(len, out)) == records.footprint(len(payload))
