"""Reading Swift's metadata pickles without running them: everything Swift writes reads
as pickle reads it, and an application's hostile value costs nothing."""
from __future__ import annotations

import pickle
import random
import struct
import time
import tracemalloc

from test_namespace import swift_xattrs

from packfs.swiftmeta.swiftpickle import load_metadata
from packfs.namespace.xattrblob import pack_xattrs, unpack_xattrs


def metadata_pickle(**metadata: str) -> bytes:
    return swift_xattrs(**metadata)[b"user.swift.metadata"]


def test_swifts_own_pickles_read_as_pickle_reads_them():
    """One item (SETITEM), several (MARK ... SETITEMS), more than a batch of 1,000 and more
    than 256 memo entries (LONG_BINPUT, LONG_BINGET), empty values (bytes()), latin-1's
    high half, and one bytes object under two keys (a BINGET of it)."""
    shared = b"twice"
    cases = [
        metadata_pickle(**{"X-Timestamp": "1763872345.12345"}),
        metadata_pickle(**{"X-Timestamp": "1763872345.12345", "Content-Type": "application/octet-stream",
                           "Content-Length": "4096", "ETag": "3f9a" * 8, "name": "/AUTH_test/c/obj",
                           "X-Object-Meta-Empty": "", "X-Object-Meta-Uni": "\u00e9t\u00e9 \u65e5\u672c"}),
        metadata_pickle(**{f"X-Object-Meta-{i}": str(i % 7) for i in range(2_500)}),
        pickle.dumps({b"a": shared, b"b": shared, b"c": bytes(range(256))}, 2),
        pickle.dumps({}, 2),
    ]
    for data in cases:
        assert load_metadata(data) == pickle.loads(data)


def test_anything_but_a_dict_of_bytes_is_none():
    for value in ({"name": "/AUTH_test/c/o"}, {b"name": "str"}, {b"n": 1}, [b"a", b"b"], b"bytes", None):
        assert load_metadata(pickle.dumps(value, 2)) is None
    for protocol in (3, 4, 5):
        assert load_metadata(pickle.dumps({b"a": b"b"}, protocol)) is None
    assert load_metadata(b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.") is None
    assert load_metadata(pickle.dumps({b"a": b"b"}, 2) + b"more") is None


def test_every_prefix_and_random_damage_is_none_or_a_dict_never_an_error():
    data = metadata_pickle(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o", "ETag": "ab" * 16})
    for end in range(len(data)):
        assert load_metadata(data[:end]) is None
    rng = random.Random(5)
    for _ in range(3_000):
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        got = load_metadata(bytes(damaged))
        assert got is None or type(got) is dict


def test_a_hostile_value_costs_no_memory_and_calls_nothing():
    """pickle's Unpickler, globals restricted as they were, grew its memo table to twice a
    memo index (this one: 256 MiB; 2^28 took 4 GiB and 7 s), called bytes(n) and ran any
    codec `_codecs.encode` was given."""
    hostile = [
        b"\x80\x02}r\xff\xff\xff\x00.",  # a memo index of 2^24
        b"\x80\x02}q\x00(X\x01\x00\x00\x00ar\xff\xff\xff\x00c__builtin__\nbytes\nJ\x00\x00\x00\x10\x85Ru.",
        b"\x80\x02}q\x00(X\x01\x00\x00\x00ac_codecs\nencode\nX\x02\x00\x00\x00abX\x03\x00\x00\x00hex\x86Ru.",
        b"\x80\x02X\xff\xff\xff\x7fabc.",  # a string longer than the input
    ]
    for data in hostile:
        xattrs = {b"user.swift.metadata": data + b"\0" * 200}
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            assert load_metadata(data) in (None, {})
            stored = pack_xattrs(xattrs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20 and time.perf_counter() - t0 < 1, (data, peak)
        assert unpack_xattrs(stored) == xattrs  # kept as it was set, deflated whole


def test_marks_cost_linear_time():
    """30,000 dicts, then 15,000 empty MARK ... SETITEMS on the top one (60 KB, about the
    most one inode's xattrs may hold): a search for each MARK down the stack took 0.70 s.
    Twice the pickle must take about twice the time, not four times (the best of three
    runs each, so that a busy machine does not decide it)."""
    def seconds(n: int) -> float:
        data = b"\x80\x02" + b"}" * (2 * n) + b"(u" * n + b"."
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert load_metadata(data) is None  # 2n dicts on the stack at the end: not one
            best = min(best, time.perf_counter() - t0)
        return best

    assert seconds(15_000) < 3 * seconds(7_500)


def test_a_memo_index_past_the_pickles_own_stays_out_of_the_swift_form():
    """The parser keeps a memo as a dict, so an index pickle never writes still reads; the
    Swift form then refuses it, as pickling the dict again gives other bytes."""
    data = pickle.dumps({b"a": b"b", b"c": b"d"}, 2)
    renumbered = data.replace(b"q\x01", b"r" + struct.pack("<I", 1 << 30)).replace(b"h\x01", b"j" + struct.pack("<I", 1 << 30))
    assert renumbered != data and load_metadata(renumbered) == {b"a": b"b", b"c": b"d"}
    xattrs = {b"user.swift.metadata": renumbered + b"\0" * 100}
    stored = pack_xattrs(xattrs)
    assert stored[:2] == b"\xff\xfe" and unpack_xattrs(stored) == xattrs
