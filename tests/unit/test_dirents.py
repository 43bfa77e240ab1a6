import pytest

from packfs.dirents import PackedEntries


def test_packed_entries_behave_like_the_dict_they_replace():
    e, d = PackedEntries(), {}
    names = [b"%03x" % i for i in range(50)] + [b"a", b"ab", b"b", b"%032x" % 7]
    for i, name in enumerate(names):
        e[name] = d[name] = 100 + i
    e[b"ab"] = d[b"ab"] = 7  # replaced, not added
    for name in names + [b"zz", b"0", b"%03x" % 99, b"a/b"[:1]]:
        assert e.get(name) == d.get(name)
    assert e.get(b"c") is None and len(e) == len(d) == len(names)
    for name in (b"a", b"%03x" % 0, b"%032x" % 7, b"%03x" % 49):
        assert e.pop(name) == d.pop(name)
    assert e.pop(b"a") is None and e.pop(b"a", -1) == -1
    assert e.items() == list(d.items())  # the order the names were added in
    assert e.get(b"ab") == 7 and e.get(b"b") == d[b"b"]


def test_a_name_is_never_found_as_part_of_another():
    e = PackedEntries([(b"abc", 1), (b"bc", 2), (b"ab", 3)])
    assert (e.get(b"b"), e.get(b"bc"), e.get(b"ab"), e.get(b"abc")) == (None, 2, 3, 1)
    assert e.pop(b"bc") == 2 and e.items() == [(b"abc", 1), (b"ab", 3)]


def test_empty_and_restored():
    e = PackedEntries([(b"x", 1)])
    assert e.pop(b"x") == 1 and e.items() == [] and len(e) == 0
    f = PackedEntries([(b"x", 1), (b"yy", 2)])
    g = PackedEntries.restore(f.dump())
    assert g.items() == f.items() and g.get(b"yy") == 2
    with pytest.raises(ValueError):
        PackedEntries.restore((b"/x/yy/", (1).to_bytes(4, "little")))  # two names, one number


def test_names_of_one_length_are_indexed_by_offset_until_another_length_comes():
    e = PackedEntries((b"%03x" % i, i) for i in range(4096))
    assert e.width == 4 and e.get(b"fff") == 4095 and e.get(b"800") == 2048
    assert e.pop(b"100") == 256 and e.get(b"101") == 257 and e.get(b"fff") == 4095 and e.width == 4
    e[b"tmp.1763872345"] = 9  # another length: separators are counted from now on
    assert e.width == 0 and e.get(b"fff") == 4095 and e.get(b"tmp.1763872345") == 9
    assert PackedEntries.restore(e.dump()).width == 0
    assert PackedEntries.restore(PackedEntries([(b"ab", 1), (b"cd", 2)]).dump()).width == 3
