"""The pending changes a checkpoint writes: packed per commit, given back as sets."""
from __future__ import annotations

from packfs.namespace.changes import Changes, PendingChanges


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


def test_parts_give_each_change_once_and_all_of_them():
    p = PendingChanges()
    for commit in range(5):  # the same inodes and entries in several commits, as directories are
        p.merge(changes({1, 2, 10 + commit}, {(1, b"same"), (1, b"e%d" % commit), (2, b"x" * 200)},
                        {(1, 0, 4096)} if commit == 3 else ()))
    for size in (1, 2, 3, 100):
        parts = list(p.parts(size))
        assert all(len(part.inodes) <= size and len(part.dirents) <= size for part in parts)
        inodes = [i for part in parts for i in part.inodes]
        dirents = [d for part in parts for d in part.dirents]
        assert sorted(inodes) == sorted(p.changes().inodes) and len(set(dirents)) == len(dirents)
        assert set(dirents) == p.changes().dirents
        assert parts[0].refs == {(1, 0, 4096)} and not any(part.refs for part in parts[1:])
    taken = PendingChanges()
    taken.extend(p)
    taken.extend(p)
    assert taken.changes().inodes == p.changes().inodes and taken.inode_count == 2 * p.inode_count


def test_a_commits_changes_in_parts_are_each_once_and_all_of_them():
    ch = Changes()
    ch.inodes = set(range(10, 33))
    ch.dirents = {(1, b"n%d" % i) for i in range(9)}
    ch.refs = {(1, 4096, 100)}
    parts = list(ch.parts(5))
    assert len(parts) == 5
    assert all(len(p.inodes) <= 5 and len(p.dirents) <= 5 for p in parts)
    assert sorted(i for p in parts for i in p.inodes) == sorted(ch.inodes)
    assert sorted(e for p in parts for e in p.dirents) == sorted(ch.dirents)
    assert parts[0].refs == ch.refs and not any(p.refs for p in parts[1:])
    assert len(list(Changes().parts(5))) == 1  # nothing changed: one empty part
