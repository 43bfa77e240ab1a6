"""writeback.Buffer, the unflushed run of a file: its bytes must always equal those of a
plain bytearray given the same writes, whatever mix of appends, overwrites, partial
flushes and truncations reaches it."""
from __future__ import annotations

import random

import pytest

from packfs.core.writeback import Buffer


def _contents(buf: Buffer) -> bytes:
    out = bytearray(buf.size)
    buf.copy_into(out, buf.start)
    return bytes(out)


def test_appends_are_kept_uncopied():
    buf = Buffer(100)
    a, b = b"x" * 10, b"y" * 5
    assert buf.put(0, a) == 10 and buf.put(10, b) == 5
    assert buf.parts[0] is a and buf.parts[1] is b
    assert (buf.start, buf.size, buf.end) == (100, 15, 115)


def test_first_and_consume_split_a_part():
    buf = Buffer(0)
    buf.put(0, b"abcdef")
    buf.put(6, b"ghij")
    assert b"".join(buf.first(8)) == b"abcdefgh"
    assert _contents(buf) == b"abcdefghij"  # first() leaves the run as it was
    buf.consume(8)
    assert (buf.start, buf.size) == (8, 2)
    assert _contents(buf) == b"ij"


def test_overwrite_inside_the_run_and_past_its_end():
    buf = Buffer(0)
    buf.put(0, b"aaaa")
    buf.put(4, b"bbbb")
    assert buf.put(2, b"XX") == 0
    assert _contents(buf) == b"aaXXbbbb"
    assert buf.put(6, b"YYYY") == 2
    assert _contents(buf) == b"aaXXbbYYYY"


def test_copy_into_a_window_of_the_file():
    buf = Buffer(10)
    buf.put(0, b"0123")
    buf.put(4, b"4567")
    out = bytearray(b"." * 6)
    buf.copy_into(out, 12)  # out holds the file's bytes 12..17
    assert out == b"234567"
    out = bytearray(b"." * 6)
    buf.copy_into(out, 6)  # 6..11: the run covers 10 and 11
    assert out == b"....01"
    out = bytearray(b"." * 4)
    buf.copy_into(out, 30)  # past the run
    assert out == b"...."


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_match_a_bytearray(seed):
    rnd = random.Random(seed)
    buf, model, start = Buffer(1000), bytearray(), 1000
    for _ in range(300):
        op = rnd.random()
        if op < 0.6:
            pos = len(model) if rnd.random() < 0.7 else rnd.randint(0, len(model))
            data = rnd.randbytes(rnd.randint(0, 300))
            before = len(model)
            model[pos:pos + len(data)] = data
            assert buf.put(pos, data) == len(model) - before
        elif op < 0.8 and model:
            n = rnd.randint(0, len(model))
            assert b"".join(buf.first(n)) == model[:n]
            buf.consume(n)
            del model[:n]
            start += n
        elif op < 0.9:
            n = rnd.randint(0, len(model))
            buf.truncate(n)
            del model[n:]
        assert (buf.start, buf.size) == (start, len(model))
        assert _contents(buf) == model
