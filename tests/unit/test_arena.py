import pytest

from array import array

from packfs.namespace.arena import COUNTED_MAX_LEN, MAX_LEN, Arena, CountedArena


def test_strings_come_back_and_compare():
    a = Arena()
    refs = [a.put(b"x" * n) for n in (1, 3, 32, 300)]
    assert all(refs) and [a.get(r) for r in refs] == [b"x" * n for n in (1, 3, 32, 300)]
    assert a.equals(refs[2], b"x" * 32)
    assert not a.equals(refs[2], b"x" * 31) and not a.equals(refs[2], b"y" + b"x" * 31)
    assert a.used == len(a.data) == 336


def test_freed_space_goes_to_the_next_string_of_its_size_class():
    a = Arena(grain=16)
    first = a.put(b"a" * 100)  # 7 grains: 112 B
    a.put(b"b" * 20)
    end = len(a.data)
    a.release(first)
    assert a.used == 32
    again = a.put(b"c" * 97)  # also 7 grains: reuses the freed run
    assert len(a.data) == end and again >> 24 == first >> 24 and a.get(again) == b"c" * 97
    other = a.put(b"d" * 120)  # 8 grains: appended
    assert other >> 24 == end and len(a.data) == end + 128
    a.release(0)  # no string: ignored
    assert a.used == 112 + 32 + 128


def test_bad_lengths_are_refused():
    a = Arena()
    with pytest.raises(ValueError):
        a.put(b"")
    with pytest.raises(ValueError):
        a.put(bytes(MAX_LEN + 1))


def test_restore_keeps_strings_and_free_lists():
    a = Arena(grain=8)
    refs = [a.put(b"%d" % n * 5) for n in range(10)]
    a.release(refs[4])
    b = Arena.restore(8, bytes(a.data), a.free_lists())
    assert [b.get(r) for r in refs if r != refs[4]] == [a.get(r) for r in refs if r != refs[4]]
    assert b.used == a.used and b.put(b"4" * 5) >> 24 == refs[4] >> 24


def test_restore_refuses_free_space_outside_the_arena():
    a = Arena()
    a.put(b"abc")
    with pytest.raises(ValueError):
        Arena.restore(1, bytes(a.data), {3: (100).to_bytes(8, "little")})


def test_compacted_copy_drops_the_free_space_and_keeps_every_string():
    a = Arena(grain=16)
    refs = array("q", [0] * 6)
    bigs = []
    for i in range(1, 6):
        bigs.append(a.put(b"plain %d " % i * 30))
        refs[i] = a.put(b"small %d" % i)
    for big in bigs:
        a.release(big)
    assert a.wasted() == 5 * 240
    b, moved = a.compacted(refs)
    assert moved[0] == 0 and b.wasted() == 0 and len(b.data) == 5 * 16
    assert [b.get(r) for r in moved[1:]] == [a.get(r) for r in refs[1:]]


@pytest.mark.parametrize("n, prefix", [(1, 1), (7, 1), (127, 1), (128, 2), (16383, 2), (16384, 3), (1 << 21, 4)])
def test_counted_strings_carry_their_length_and_are_named_by_where_they_start(n, prefix):
    """A counted arena's reference is the offset in grains plus one: a u32 for 32 GiB. The
    first two grains are no string's, so no string is named 1 or 2."""
    a = CountedArena(grain=8)
    first = a.put(b"a" * 3)  # 1 + 3 bytes: one grain
    ref = a.put(b"x" * n)
    assert (first, ref) == (3, 4)
    assert a.get(ref) == b"x" * n and a.equals(ref, b"x" * n)
    assert not a.equals(ref, b"x" * (n + 1)) and not a.equals(ref, b"y" + b"x" * (n - 1))
    assert a.used == len(a.data) == 3 * 8 + -(-(prefix + n) // 8) * 8
    a.release(ref)
    assert a.put(b"z" * n) == ref and a.get(ref) == b"z" * n  # the freed run, by its size class
    assert a.get(first) == b"aaa"


def test_counted_arena_refuses_bad_lengths_and_restores_and_compacts():
    a = CountedArena(grain=8)
    with pytest.raises(ValueError):
        a.put(b"")
    with pytest.raises(ValueError):
        a.put(bytes(COUNTED_MAX_LEN + 1))
    refs = array("I", [0] + [a.put(b"%d" % i * (i * 9)) for i in range(1, 9)])
    a.release(refs[3])
    a.release(refs[6])
    refs[3] = refs[6] = 0
    b = CountedArena.restore(8, bytes(a.data), a.free_lists())
    assert type(b) is CountedArena and b.used == a.used
    assert [b.get(r) for r in refs if r] == [a.get(r) for r in refs if r]
    c, moved = a.compacted(refs)
    assert type(c) is CountedArena and c.wasted() == 0 and moved.typecode == "I"
    assert moved[0] == moved[3] == moved[6] == 0
    assert [c.get(r) for r in moved if r] == [a.get(r) for r in refs if r]
    assert len(c.data) == a.used
