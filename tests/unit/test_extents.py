"""Extent maps: insert, punch and pieces, including splits, against a byte-level model."""
from __future__ import annotations

import random

from packfs.store import extents as ext


def E(off, length, rec, skip=0, rlen=None):  # noqa: N802 - a short constructor reads best here
    return (off, length, 1, rec, skip, rlen if rlen is not None else length + skip)


def test_append_fast_path():
    m = []
    ext.insert(m, E(0, 10, 0))
    ext.insert(m, E(10, 10, 4096))
    ext.insert(m, E(100, 5, 8192))  # past the end, leaving a hole
    assert m == [E(0, 10, 0), E(10, 10, 4096), E(100, 5, 8192)]


def test_insert_overwrites_whole_extent():
    m = [E(0, 10, 0), E(10, 10, 4096)]
    _, dropped, split = ext.insert(m, E(10, 10, 8192))
    assert m == [E(0, 10, 0), E(10, 10, 8192)]
    assert dropped == [(1, 4096, 10)] and split == []


def test_insert_splits_an_extent():
    m = [E(0, 100, 0)]
    _, dropped, split = ext.insert(m, E(40, 20, 4096))
    assert m == [(0, 40, 1, 0, 0, 100), E(40, 20, 4096), (60, 40, 1, 0, 60, 100)]
    assert dropped == [] and split == [(1, 0, 100)]


def test_insert_trims_both_neighbours():
    m = [E(0, 50, 0), E(50, 50, 4096)]
    _, dropped, split = ext.insert(m, E(30, 40, 8192))
    assert m == [(0, 30, 1, 0, 0, 50), E(30, 40, 8192), (70, 30, 1, 4096, 20, 50)]
    assert dropped == [] and split == []


def test_insert_covering_many():
    m = [E(0, 10, 0), E(10, 10, 4096), E(20, 10, 8192), E(30, 10, 12288)]
    _, dropped, split = ext.insert(m, E(5, 30, 16384))
    assert m == [(0, 5, 1, 0, 0, 10), E(5, 30, 16384), (35, 5, 1, 12288, 5, 10)]
    assert sorted(dropped) == [(1, 4096, 10), (1, 8192, 10)]


def test_punch_middle_and_tail():
    m = [E(0, 100, 0)]
    _, dropped, split = ext.punch(m, 10, 20)
    assert m == [(0, 10, 1, 0, 0, 100), (20, 80, 1, 0, 20, 100)]
    assert split == [(1, 0, 100)] and dropped == []
    _, dropped, split = ext.punch(m, 5, ext.INFINITY)
    assert m == [(0, 5, 1, 0, 0, 100)]
    assert dropped == [(1, 0, 100)]  # the right-hand piece lost its last extent


def test_punch_nothing():
    m = [E(0, 10, 0)]
    assert ext.punch(m, 10, 20) == ([E(0, 10, 0)], [], [])
    assert ext.punch(m, 5, 5) == ([E(0, 10, 0)], [], [])
    assert ext.punch([], 0, 100) == ([], [], [])


def test_pieces_holes_and_extents():
    m = [E(10, 10, 0), E(30, 5, 4096)]
    assert list(ext.pieces(m, 0, 40)) == [(0, 10, None), (10, 10, m[0]), (20, 10, None), (30, 5, m[1]),
                                          (35, 5, None)]
    assert list(ext.pieces(m, 15, 32)) == [(15, 5, m[0]), (20, 10, None), (30, 2, m[1])]
    assert list(ext.pieces([], 0, 5)) == [(0, 5, None)]
    assert list(ext.pieces(m, 12, 12)) == []


def test_random_against_model():
    """Random inserts and punches, resolved through pieces, match a byte-per-position model."""
    rnd = random.Random(5)
    records: dict[int, bytes] = {}
    m: list = []
    model = [None] * 600  # which (record, byte) each file position holds
    live: dict[tuple, int] = {}  # record key -> extents referring to it
    next_rec = 0
    for _ in range(2000):
        if rnd.random() < 0.75:
            off, length = rnd.randrange(0, 550), rnd.randrange(1, 50)
            rec = next_rec
            next_rec += 4096
            records[rec] = bytes(rnd.randrange(256) for _ in range(length))
            _, dropped, split = ext.insert(m, (off, length, 1, rec, 0, length))
            for i in range(length):
                model[off + i] = (rec, i)
        else:
            a = rnd.randrange(0, 600)
            b = rnd.randrange(a, 601)
            _, dropped, split = ext.punch(m, a, b)
            for i in range(a, b):
                model[i] = None
        for k in split:
            live[k] = live.get(k, 1) + 1
        for k in dropped:
            live[k] = live.get(k, 1) - 1
        # The map stays sorted and non-overlapping.
        for x, y in zip(m, m[1:]):
            assert x[0] + x[1] <= y[0]
        assert all(e[1] > 0 and 0 <= e[4] and e[4] + e[1] <= e[5] for e in m)
        for pos, length, e in ext.pieces(m, 0, 600):
            for i in range(length):
                want = model[pos + i]
                if e is None:
                    assert want is None
                else:
                    assert want == (e[3], e[4] + (pos + i - e[0]))
    # Reference counting: every record still referred to by the map has a positive count,
    # and no record referred to by the map was reported dead.
    in_map: dict[tuple, int] = {}
    for e in m:
        in_map[ext.key(e)] = in_map.get(ext.key(e), 0) + 1
    for k, n in in_map.items():
        assert live.get(k, 1) == n
    for k, n in live.items():
        if k not in in_map:
            assert n == 0
