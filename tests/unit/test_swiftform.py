"""The Swift form in C (packfs/swiftmeta/_swiftform.c) against the Python it stands in for: the same
pickles byte for byte, the same decisions on any input, the same errors."""
from __future__ import annotations

import errno
import hashlib
import pickle
import random
import time
import zlib

import pytest
from test_namespace import swift_xattrs

from packfs.namespace import xattrblob
from packfs.errors import FsError

C = xattrblob._swiftform


@pytest.fixture(autouse=True)
def built():
    assert C is not None, "packfs/swiftmeta/_swiftform.c is not built"


def python_path(monkeypatch) -> None:
    monkeypatch.setattr(xattrblob, "_swiftform", None)


def random_bytes(rng: random.Random) -> bytes:
    """The values that pickle and store differently: b"" and the one-byte singletons (memo
    hits), lowercase hex and timestamps (kept as their bytes), latin-1's high half."""
    r = rng.random()
    if r < 0.1:
        return b""
    if r < 0.3:
        return bytes([rng.randrange(256)])
    if r < 0.45:
        return rng.randbytes(rng.randrange(1, 20)).hex().encode()
    if r < 0.6:
        return b"%010d.%05d" % (rng.randrange(10**10), rng.randrange(10**5))
    return rng.randbytes(rng.randrange(2, 40))


def random_dicts(seed: int, count: int):
    """Dicts of bytes of 0 to 12 items, and now and then of the sizes where pickle changes
    its writing: one item (SETITEM), 256 memo slots (LONG_BINPUT), batches of 1,000."""
    rng = random.Random(seed)
    for n in range(count):
        size = rng.choice([0, 1, 2, 40, 130, 999, 1000, 1001, 2000]) if n % 50 == 0 else rng.randrange(13)
        yield rng, {random_bytes(rng): random_bytes(rng) for _ in range(size)}


def test_the_pickle_made_again_is_pickles_byte_for_byte():
    """Decoded in C, the items of any dict of bytes give pickle.dumps's bytes (the blob is
    the metadata xattr alone: no checksum flag, nothing after)."""
    for _, d in random_dicts(1, 5_000):
        items = xattrblob._items(d)
        want = pickle.dumps(xattrblob._read_items(items, 0)[0], 2)
        payload = zlib.crc32(want).to_bytes(4, "little") + items + b"\0"
        plain = C.plain_blob(xattrblob._deflate(payload, xattrblob._XZ_DICT_4), xattrblob._XZ_DICT_4)
        assert plain == xattrblob.pack_xattrs({b"user.swift.metadata": want}, compress=False)


def test_the_items_of_a_pickle_are_pythons_for_any_input(monkeypatch):
    """Swift's pickles, dicts holding one bytes object twice (they pickle back otherwise:
    no Swift form), every prefix of one and random damage: C and Python decide alike."""
    def both(meta: bytes) -> bytes | None:
        got = xattrblob._swift_items(meta)
        with monkeypatch.context() as m:
            python_path(m)
            assert xattrblob._swift_items(meta) == got
        return got

    kept = 0
    for rng, d in random_dicts(2, 3_000):
        if d and rng.random() < 0.15:
            d[b"twin"] = next(iter(d.values()))
        meta = pickle.dumps(d, 2)
        kept += both(meta) is not None
        for _ in range(3):
            damaged = bytearray(meta)
            for _ in range(rng.randrange(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            both(bytes(damaged))
    assert 2_000 < kept < 3_000  # most are kept, the twins are not
    meta = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o"})[b"user.swift.metadata"]
    assert both(meta) is not None
    for end in range(len(meta)):
        assert both(meta[:end]) is None
    for other in (pickle.dumps({b"a": b"b"}, 3), pickle.dumps({"a": "b"}, 2), pickle.dumps({b"a": b"b"}, 2) + b".",
                  b"\x80\x02}q\x00}q\x01.", b"\x80\x02}q\x00h\x00."):
        assert both(other) is None


def test_a_hostile_pickle_costs_nothing():
    """Memo slots out of order or far away, a string longer than the input, 64 KiB of
    marks or of strings: None, fast, and nothing kept."""
    hostile = [b"\x80\x02}r\xff\xff\xff\x00.", b"\x80\x02X\xff\xff\xff\x7fabc.", b"\x80\x02}" + b"(" * 65_536,
               b"\x80\x02}(" + b"X\x01\x00\x00\x00a" * 10_000 + b"u.", b"\x80\x02}q\x01."]
    for data in hostile:
        t0 = time.perf_counter()
        assert C.swift_items(data) is None
        assert time.perf_counter() - t0 < 0.05


def test_md5_is_hashlibs():
    rng = random.Random(3)
    for n in [*range(200), 1 << 16, (1 << 16) + 55]:
        data = rng.randbytes(n)
        assert C.md5_hexdigest(data) == hashlib.md5(data).hexdigest().encode()


def stored_payload(xattrs: dict[bytes, bytes]) -> bytes:
    stored = xattrblob.pack_xattrs(xattrs)
    assert stored[:2] == b"\xff\xfd"
    return zlib.decompressobj(-15, xattrblob._XZ_DICT_4).decompress(stored[2:])


def swift_form(payload: bytes) -> bytes:
    """A stored blob of a payload."""
    return b"\xff\xfd" + xattrblob._deflate(payload, xattrblob._XZ_DICT_4)


def test_decoding_gives_pythons_blob_and_damage_fails_alike(monkeypatch):
    """With and without the checksum derived, other xattrs after Swift's; cut short and
    damaged, before deflating and after, it reads the same in both or fails in both (EIO)."""
    rng = random.Random(4)
    cases = []
    for i, (_, d) in enumerate(random_dicts(5, 300)):
        meta = pickle.dumps(d, 2)
        xattrs = {b"user.swift.metadata": meta}
        if i % 3:
            xattrs[b"user.swift.metadata_checksum"] = hashlib.md5(meta).hexdigest().encode()
        if i % 4 == 0:
            xattrs[b"user.after"] = rng.randbytes(rng.randrange(30))
        if xattrblob.compressible(xattrblob.pack_xattrs(xattrs, compress=False)):
            cases.append(xattrs)
    assert len(cases) > 100

    def decoded(stored: bytes) -> bytes | int:
        try:
            return xattrblob.plain(stored)
        except FsError as e:
            return e.errno

    for xattrs in cases:
        payload = stored_payload(xattrs)
        assert C.plain_blob(swift_form(payload)[2:], xattrblob._XZ_DICT_4) == xattrblob.pack_xattrs(xattrs, compress=False)
        stored = swift_form(payload)
        variants = [swift_form(payload[:end]) for end in range(0, len(payload), 7)]
        variants += [stored[:end] for end in range(2, len(stored), 5)]  # the deflated stream cut short
        for _ in range(5):
            for whole in (payload, stored):
                damaged = bytearray(whole)
                damaged[rng.randrange(2 if whole is stored else 0, len(damaged))] = rng.randrange(256)
                variants.append(swift_form(bytes(damaged)) if whole is payload else bytes(damaged))
        for v in variants:
            in_c = decoded(v)
            with monkeypatch.context() as m:
                python_path(m)
                assert decoded(v) == in_c


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_pickle_that_comes_out_otherwise_than_stored_is_eio(monkeypatch, path):
    """The stored CRC-32 is of the pickle Swift wrote: a pickler that writes other bytes
    (here: the CRC of a protocol-3 pickle stored) fails loudly rather than give Swift a
    wrong pickle."""
    if path == "python":
        python_path(monkeypatch)
    xattrs = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o"})
    payload = stored_payload(xattrs)
    other = pickle.dumps(pickle.loads(xattrs[b"user.swift.metadata"]), 3)
    forged = zlib.crc32(other).to_bytes(4, "little") + payload[4:]
    c = zlib.compressobj(6, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, xattrblob._XZ_DICT_4)
    with pytest.raises(FsError) as e:
        xattrblob.unpack_xattrs(b"\xff\xfd" + c.compress(forged) + c.flush())
    assert e.value.errno == errno.EIO and "CRC" in str(e.value)


def test_the_compressor_stores_the_same_bytes_either_way(monkeypatch):
    """The Swift form a build with the C part stores is the one without it stores: a pack
    moved between them reads the same."""
    for _, d in random_dicts(6, 500):
        meta = pickle.dumps(d, 2)
        xattrs = {b"user.swift.metadata": meta, b"user.swift.metadata_checksum": hashlib.md5(meta).hexdigest().encode()}
        with_c = xattrblob.pack_xattrs(xattrs)
        with monkeypatch.context() as m:
            python_path(m)
            assert xattrblob.pack_xattrs(xattrs) == with_c
            assert xattrblob.unpack_xattrs(with_c) == xattrs
        assert xattrblob.unpack_xattrs(with_c) == xattrs
