"""The pending changes a checkpoint writes: packed per commit, given back as sets."""
from __future__ import annotations

from packfs.changes import Changes, PendingChanges


def changes(inodes=(), dirents=(), refs=()) -> Changes:
    c = Changes()
    c.inodes, c.dirents, c.refs = set(inodes), set(dirents), set(refs)
    return c


def test_pending_changes_give_back_the_union_of_every_commit():
    long_name = b"n" * 255  # a length that takes two bytes
    p = PendingChanges()
    assert not p and p.inode_count == 0
    p.merge(changes({2, 7}, {(1, b"a"), (1, long_name)}, {(1, 4096, 8192)}))
    p.merge(changes({7, 2**32 - 2}, {(1, b"a"), (7, b""), (7, b"\xff\x00")}))
    p.merge(Changes())
    assert p and p.inode_count == 4  # once per commit that changed them
    got = p.changes()
    assert got.inodes == {2, 7, 2**32 - 2}
    assert got.dirents == {(1, b"a"), (1, long_name), (7, b""), (7, b"\xff\x00")}
    assert got.refs == {(1, 4096, 8192)}


def test_a_ref_alone_is_a_pending_change():
    p = PendingChanges()
    p.merge(changes(refs={(3, 0, 4096)}))
    assert p and p.changes().refs == {(3, 0, 4096)} and not p.changes().inodes
