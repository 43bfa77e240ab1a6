import pytest

from packfs.namespace.dirents import PackedEntries


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


def test_hex_names_are_stored_in_half_their_bytes_and_come_back_the_same():
    from packfs.namespace.dirents import name_of, stored_name
    h = b"d41d8cd98f00b204e9800998ecf8427e"  # a Swift hash directory's name
    assert len(stored_name(h)) == 17 and name_of(stored_name(h)) == h
    for name in (b"1763872345.12345.data", b"D41D8CD98F00B204E9800998ECF8427E", b"abc", b"0a1", b"tmp",
                 b"\xff\xfe", b"0" * 254, b"ab" * 127 + b"g", b"00"):
        assert name_of(stored_name(name)) == name
    assert stored_name(b"D41D8CD98F00B204") == b"D41D8CD98F00B204"  # upper case: kept as it is


def test_swift_timestamp_names_are_stored_in_9_bytes_and_come_back_the_same():
    from packfs.namespace.dirents import name_of, stored_name
    for name in (b"1763872345.12345.data", b"0000000000.00000.ts", b"9999999999.99999.meta"):
        assert len(stored_name(name)) == 9 and name_of(stored_name(name)) == name
    # anything else is kept as it is: another extension, an offset, other digits, a suffix
    for name in (b"1763872345.12345.durable", b"1763872345.12345_0000000000000001.data",
                 b"176387234a.12345.data", b"1763872345.1234.data", b"1763872345.12345.data.tmp",
                 b"1763872345.12345.", b"+763872345.12345.data", b"1763872345/12345.data"):
        assert stored_name(name) == name and name_of(name) == name


def test_a_name_with_a_nul_is_refused():
    """The NUL that marks a stored hex name is in no name (FUSE's names are C strings)."""
    import errno

    from packfs.errors import FsError
    from packfs.namespace.namespace import ROOT, Namespace
    with pytest.raises(FsError) as e:
        Namespace.fresh().create(ROOT, b"\0abcd", 0o100644, 0, 0)
    assert e.value.errno == errno.EINVAL
