"""Listings: readdir offsets that resume each reader in its own snapshot."""
from __future__ import annotations

from packfs.fuse import listings
from packfs.fuse.listings import Listings


class Dirs:
    """Directories as lists of (name, inode), counting how often each is listed."""

    def __init__(self) -> None:
        self.entries: dict[int, list[tuple[bytes, int]]] = {}
        self.listed = 0

    def listdir(self, ino: int) -> list[tuple[bytes, int]]:
        self.listed += 1
        return list(self.entries[ino])


def read(ls: Listings, ino: int, offset: int, count: int) -> tuple[list[bytes], int]:
    """Up to `count` names from `offset`, and the offset to go on from."""
    number, entries, start = ls.resume(ino, offset)
    out = entries[start:start + count]
    return [n for n, _ in out], Listings.offset(number, start + len(out)) if out else offset


def test_a_reader_resumes_in_its_snapshot_while_the_directory_changes():
    d = Dirs()
    d.entries[7] = [(b"a", 10), (b"b", 11), (b"c", 12)]
    ls = Listings(d.listdir)
    names, off = read(ls, 7, 0, 1)
    assert names == [b"a"]
    d.entries[7].pop(0)  # "a" is removed: a fresh listing's index 1 would be "c"
    other, _ = read(ls, 7, 0, 3)  # another reader starts meanwhile
    assert other == [b"b", b"c"]
    names, off = read(ls, 7, off, 5)
    assert names == [b"b", b"c"]
    assert read(ls, 7, off, 5)[0] == []
    assert d.listed == 2  # one snapshot per reader, none for resuming


def test_a_snapshot_is_dropped_once_read_to_its_end():
    d = Dirs()
    d.entries[1] = [(b"x", 2)]
    ls = Listings(d.listdir)
    names, off = read(ls, 1, 0, 10)
    assert names == [b"x"] and len(ls) == 1
    assert read(ls, 1, off, 10)[0] == []
    assert len(ls) == 0
    d.entries[3] = []
    assert read(ls, 3, 0, 10)[0] == [] and len(ls) == 0  # an empty directory keeps nothing


def test_only_the_last_snapshots_are_kept_and_a_dropped_one_resumes_by_index():
    d = Dirs()
    for ino in range(listings.KEEP + 1):
        d.entries[ino] = [(b"%d-%d" % (ino, i), 1000 + i) for i in range(3)]
    ls = Listings(d.listdir)
    _, off0 = read(ls, 0, 0, 1)
    for ino in range(1, listings.KEEP + 1):
        read(ls, ino, 0, 1)
    assert len(ls) == listings.KEEP
    listed = d.listed
    names, off = read(ls, 0, off0, 1)  # its snapshot was the oldest: listed again
    assert names == [b"0-1"] and d.listed == listed + 1
    assert read(ls, 0, off, 5)[0] == [b"0-2"] and d.listed == listed + 1


def test_an_offset_of_another_directory_lists_this_one():
    d = Dirs()
    d.entries[1] = [(b"a", 5), (b"b", 6)]
    d.entries[2] = [(b"p", 8), (b"q", 9)]
    ls = Listings(d.listdir)
    _, off = read(ls, 1, 0, 1)
    assert read(ls, 2, off, 5)[0] == [b"q"]
    assert read(ls, 1, off, 5)[0] == [b"b"]  # the first directory's snapshot is untouched


def test_snapshots_left_unfinished_hold_a_bounded_number_of_entries():
    d = Dirs()
    big = [(b"%06d" % i, 10 + i) for i in range(listings.KEEP_ENTRIES // 4)]
    for ino in range(8):
        d.entries[ino] = big
    ls = Listings(d.listdir)
    for ino in range(8):
        read(ls, ino, 0, 1)  # each reader stops after one entry
    assert len(ls) == 4  # the oldest went first
    assert ls.held <= listings.KEEP_ENTRIES
    d.entries[9] = big * 8  # one directory larger than the bound is still listed to its end
    names, off = read(ls, 9, 0, 3)
    assert len(ls) == 1
    assert read(ls, 9, off, len(big) * 8)[0] == [n for n, _ in big * 8][3:]
    assert len(ls) == 1 and read(ls, 9, Listings.offset(off >> 32, len(big) * 8), 1)[0] == []
    assert len(ls) == 0 and ls.held == 0


def test_a_finished_snapshot_is_dropped_and_its_end_read_from_a_fresh_listing():
    d = Dirs()
    d.entries[7] = [(b"a", 10), (b"b", 11)]
    ls = Listings(d.listdir)
    number, entries, start = ls.resume(7, 0)
    assert (len(ls), ls.held) == (1, 2)
    ls.finish(number)  # its last entry went out: the fuse shim answers the end
    assert (len(ls), ls.held) == (0, 0)
    ls.finish(number)  # twice is harmless
    # Should the end still come here, a fresh listing serves it: empty while unchanged.
    assert read(ls, 7, Listings.offset(number, 2), 5)[0] == []
    assert d.listed == 2
