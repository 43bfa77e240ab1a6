"""The in-memory inode table: semantics, errnos and change tracking, without FUSE."""
from __future__ import annotations

import errno
import stat

import pytest

from packfs.namespace.dirents import PACKED_MAX, PackedEntries
from packfs.errors import FsError
from packfs.namespace.inodes import SMALL
from packfs.namespace.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT, ROOT, Namespace
from packfs.namespace.arena import RESERVED_REFS
from packfs.namespace.xattrstore import XATTR_GRAIN

REG = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755
LNK = stat.S_IFLNK | 0o777


@pytest.fixture
def ns() -> Namespace:
    n = Namespace.fresh()
    n.take_journal_changes()
    n.take_catalog_changes()
    return n


def err(fn, *args) -> int:
    with pytest.raises(FsError) as e:
        fn(*args)
    return e.value.errno


def test_fresh_root(ns):
    root = ns.get(ROOT)
    assert root.is_dir and root.nlink == 2 and root.parent == ROOT
    assert ns.lookup(ROOT, b".") == root and ns.lookup(ROOT, b"..") == root
    assert ns.listdir(ROOT) == []


def test_create_lookup_and_eexist(ns):
    f = ns.create(ROOT, b"f", REG, 10, 20)
    assert (f.uid, f.gid, f.mode, f.nlink, f.size) == (10, 20, REG, 1, 0)
    assert ns.lookup(ROOT, b"f") == f
    assert ns.lookup(ROOT, b"missing") is None
    assert err(ns.create, ROOT, b"f", REG, 0, 0) == errno.EEXIST
    assert err(ns.create, ROOT, b"f", DIR, 0, 0) == errno.EEXIST
    assert err(ns.create, ROOT, b"n" * 256, REG, 0, 0) == errno.ENAMETOOLONG
    ns.create(ROOT, b"n" * 255, REG, 0, 0)
    assert err(ns.create, f.ino, b"x", REG, 0, 0) == errno.ENOTDIR
    assert err(ns.create, 9999, b"x", REG, 0, 0) == errno.ENOENT
    assert err(ns.create, ROOT, b".", REG, 0, 0) == errno.EEXIST
    assert err(ns.create, ROOT, b"..", DIR, 0, 0) == errno.EEXIST


def test_inode_numbers_unique(ns):
    inos = {ns.create(ROOT, b"f%d" % i, REG, 0, 0).ino for i in range(100)}
    assert len(inos) == 100 and ROOT not in inos


def test_mkdir_nlink_and_rmdir(ns):
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    assert d.nlink == 2 and ns.get(ROOT).nlink == 3 and d.parent == ROOT
    sub = ns.create(d.ino, b"sub", DIR, 0, 0)
    ns.create(d.ino, b"file", REG, 0, 0)
    assert d.nlink == 3
    assert ns.lookup(sub.ino, b"..") == d
    assert err(ns.rmdir, ROOT, b"d") == errno.ENOTEMPTY
    assert err(ns.rmdir, d.ino, b"file") == errno.ENOTDIR
    assert err(ns.rmdir, ROOT, b"missing") == errno.ENOENT
    assert err(ns.rmdir, ROOT, b".") == errno.EINVAL
    assert err(ns.unlink, ROOT, b"d") == errno.EISDIR
    removed = ns.rmdir(d.ino, b"sub")
    assert removed == sub and sub.nlink == 0 and d.nlink == 2
    ns.unlink(d.ino, b"file")
    ns.rmdir(ROOT, b"d")
    assert ns.get(ROOT).nlink == 2 and ns.listdir(ROOT) == []


def test_removed_directory_refuses_new_entries(ns):
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    ns.rmdir(ROOT, b"d")
    assert err(ns.create, d.ino, b"x", REG, 0, 0) == errno.ENOENT


def test_setgid_directory(ns):
    d = ns.create(ROOT, b"d", DIR | stat.S_ISGID, 0, 500)
    f = ns.create(d.ino, b"f", REG, 7, 7)
    sub = ns.create(d.ino, b"sub", DIR, 7, 7)
    assert f.gid == 500 and sub.gid == 500 and sub.mode & stat.S_ISGID


def test_link_and_unlink(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    ns.link(f.ino, d.ino, b"g")
    assert f.nlink == 2 and ns.lookup(d.ino, b"g") == f
    assert err(ns.link, d.ino, ROOT, b"dlink") == errno.EPERM
    assert err(ns.link, f.ino, ROOT, b"d") == errno.EEXIST
    assert ns.unlink(ROOT, b"f") == f and f.nlink == 1
    assert ns.lookup(ROOT, b"f") is None
    assert err(ns.unlink, ROOT, b"f") == errno.ENOENT
    ns.unlink(d.ino, b"g")
    assert f.nlink == 0
    assert err(ns.link, f.ino, ROOT, b"again") == errno.ENOENT
    assert ns.release(f) and f.ino not in ns


def test_a_file_with_no_name_is_named_once_and_released_if_never_named(ns):
    d = ns.create(ROOT, b"d", DIR | stat.S_ISGID, 0, 7)
    ns.take_journal_changes()
    mtime = d.mtime
    t = ns.create_unlinked(d.ino, REG, 0, 0)
    assert t.nlink == 0 and t.gid == 7 and ns.listdir(d.ino) == [] and d.mtime == mtime
    assert t.ino in ns.take_journal_changes().inodes  # an fsync commits it (recovery drops it)
    ns.link(t.ino, d.ino, b"obj")
    assert t.nlink == 1 and ns.lookup(d.ino, b"obj") == t
    ns.unlink(d.ino, b"obj")
    assert err(ns.link, t.ino, d.ino, b"again") == errno.ENOENT  # named once: an ordinary file now
    gone = ns.create_unlinked(d.ino, REG, 0, 0)
    assert ns.release(gone) and gone.ino not in ns and gone.ino not in ns.linkable
    ns.rmdir(ROOT, b"d")
    assert err(ns.create_unlinked, d.ino, REG, 0, 0) == errno.ENOENT  # a removed directory


def test_release_keeps_open_or_linked(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    assert not ns.release(f)  # still named
    f.opens = 1
    ns.unlink(ROOT, b"f")
    assert not ns.release(f)  # still open
    f.opens = 0
    assert ns.release(f)
    assert not ns.release(f)  # twice is harmless


def test_rename_file_replaces_atomically(ns):
    a = ns.create(ROOT, b"a", REG, 0, 0)
    b = ns.create(ROOT, b"b", REG, 0, 0)
    replaced = ns.rename(ROOT, b"a", ROOT, b"b")
    assert replaced == b and b.nlink == 0
    assert ns.lookup(ROOT, b"b") == a and ns.lookup(ROOT, b"a") is None


def test_rename_errnos(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    full = ns.create(ROOT, b"full", DIR, 0, 0)
    ns.create(full.ino, b"x", REG, 0, 0)
    sub = ns.create(d.ino, b"sub", DIR, 0, 0)
    assert err(ns.rename, ROOT, b"d", sub.ino, b"d2") == errno.EINVAL
    assert err(ns.rename, ROOT, b"d", d.ino, b"self") == errno.EINVAL
    assert err(ns.rename, ROOT, b"d", ROOT, b"full") == errno.ENOTEMPTY
    assert err(ns.rename, ROOT, b"f", ROOT, b"d") == errno.EISDIR
    assert err(ns.rename, ROOT, b"d", ROOT, b"f") == errno.ENOTDIR
    assert err(ns.rename, ROOT, b"missing", ROOT, b"x") == errno.ENOENT
    assert err(ns.rename, ROOT, b"f", ROOT, b"n" * 256) == errno.ENAMETOOLONG
    assert err(ns.rename, ROOT, b"f", f.ino, b"x") == errno.ENOTDIR
    assert err(ns.rename, ROOT, b"f", ROOT, b"full", RENAME_NOREPLACE) == errno.EEXIST
    assert err(ns.rename, ROOT, b"f", ROOT, b"nothing", RENAME_EXCHANGE) == errno.ENOENT
    # Flags packfs does not serve are refused, never ignored.
    assert err(ns.rename, ROOT, b"f", ROOT, b"nothing", RENAME_WHITEOUT) == errno.EINVAL
    assert err(ns.rename, ROOT, b"f", ROOT, b"nothing", 8) == errno.EINVAL
    assert err(ns.rename, ROOT, b"f", ROOT, b"full", RENAME_NOREPLACE | RENAME_EXCHANGE) == errno.EINVAL
    # Nothing moved.
    assert sorted(n for n, _ in ns.listdir(ROOT)) == [b"d", b"f", b"full"]


def test_rename_dir_across_parents_link_counts(ns):
    a = ns.create(ROOT, b"a", DIR, 0, 0)
    b = ns.create(ROOT, b"b", DIR, 0, 0)
    m = ns.create(a.ino, b"m", DIR, 0, 0)
    assert (a.nlink, b.nlink) == (3, 2)
    ns.rename(a.ino, b"m", b.ino, b"m2")
    assert (a.nlink, b.nlink) == (2, 3)
    assert m.parent == b.ino and ns.lookup(m.ino, b"..") == b


def test_rename_dir_over_empty_dir(ns):
    a = ns.create(ROOT, b"a", DIR, 0, 0)
    b = ns.create(ROOT, b"b", DIR, 0, 0)
    assert ns.get(ROOT).nlink == 4
    replaced = ns.rename(ROOT, b"a", ROOT, b"b")
    assert replaced == b and b.nlink == 0
    assert ns.get(ROOT).nlink == 3 and ns.lookup(ROOT, b"b") == a


def test_rename_same_inode_is_noop(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.link(f.ino, ROOT, b"g")
    assert ns.rename(ROOT, b"f", ROOT, b"g") is None
    assert ns.lookup(ROOT, b"f") == f and ns.lookup(ROOT, b"g") == f and f.nlink == 2


def test_rename_exchange(ns):
    p1 = ns.create(ROOT, b"p1", DIR, 0, 0)
    p2 = ns.create(ROOT, b"p2", DIR, 0, 0)
    d = ns.create(p1.ino, b"d", DIR, 0, 0)
    f = ns.create(p2.ino, b"f", REG, 0, 0)
    ns.rename(p1.ino, b"d", p2.ino, b"f", RENAME_EXCHANGE)
    assert ns.lookup(p1.ino, b"d") == f and ns.lookup(p2.ino, b"f") == d
    assert (p1.nlink, p2.nlink) == (2, 3)
    assert d.parent == p2.ino


def test_xattrs(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    assert err(ns.getxattr, f.ino, b"user.a") == errno.ENODATA
    ns.setxattr(f.ino, b"user.a", b"1")
    ns.setxattr(f.ino, b"user.b", b"x" * 65536)
    assert ns.getxattr(f.ino, b"user.b") == b"x" * 65536
    assert sorted(ns.listxattr(f.ino)) == [b"user.a", b"user.b"]
    assert err(ns.setxattr, f.ino, b"user.c", b"x" * 65537) == errno.E2BIG
    assert err(ns.setxattr, f.ino, b"", b"") == errno.ERANGE
    assert err(ns.setxattr, f.ino, b"u" * 256, b"") == errno.ERANGE
    ns.removexattr(f.ino, b"user.a")
    assert err(ns.removexattr, f.ino, b"user.a") == errno.ENODATA
    ns.removexattr(f.ino, b"user.b")
    assert f.xattrs is None and ns.listxattr(f.ino) == []


# -- change tracking -------------------------------------------------------------------------


def test_changes_track_inodes_and_dirents(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ch = ns.take_journal_changes()
    assert ch.inodes == {ROOT, f.ino}
    assert ch.dirents == {(ROOT, b"f")}
    assert not ns.take_journal_changes()  # taken: nothing left
    ns.setxattr(f.ino, b"user.x", b"y")
    ch = ns.take_journal_changes()
    assert ch.inodes == {f.ino} and not ch.dirents
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    ns.rename(ROOT, b"f", d.ino, b"g")
    ch = ns.take_journal_changes()
    assert ch.inodes == {ROOT, d.ino, f.ino}
    assert ch.dirents == {(ROOT, b"d"), (ROOT, b"f"), (d.ino, b"g")}


def test_catalog_changes_accumulate_journal_takes(ns):
    a = ns.create(ROOT, b"a", REG, 0, 0)
    ns.take_journal_changes()
    b = ns.create(ROOT, b"b", REG, 0, 0)
    ns.take_journal_changes()
    ch = ns.take_catalog_changes().changes()
    assert ch.inodes == {ROOT, a.ino, b.ino}
    assert ch.dirents == {(ROOT, b"a"), (ROOT, b"b")}
    assert not ns.take_catalog_changes()


def test_release_is_tracked_as_removal(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.take_journal_changes()
    ns.unlink(ROOT, b"f")
    ns.release(f)
    ch = ns.take_journal_changes()
    assert f.ino in ch.inodes and f.ino not in ns
    assert (ROOT, b"f") in ch.dirents


def test_extent_accounting_frees_dead_records(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.map_extent(f, (0, 100, 1, 0, 0, 100))
    ns.map_extent(f, (100, 100, 1, 4096, 0, 100))
    ns.map_extent(f, (0, 100, 1, 8192, 0, 100))  # overwrites the first record entirely
    assert ns.take_frees() == [(1, 0, 100)]
    ns.map_extent(f, (140, 20, 1, 12288, 0, 20))  # splits the second record in two
    assert ns.refs == {(1, 4096, 100): 2}
    assert ns.take_frees() == []
    ns.truncate_extents(f, 150)  # drops the right piece of the split record
    assert ns.refs == {} and ns.take_frees() == []
    ns.truncate_extents(f, 0)
    assert sorted(ns.take_frees()) == [(1, 4096, 100), (1, 8192, 100), (1, 12288, 20)]


def test_a_punched_hole_frees_the_records_it_covers_and_splits_the_one_it_cuts(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    for i in range(3):
        ns.map_extent(f, (i * 100, 100, 1, i * 4096, 0, 100))
    ns.extent_edits[f.ino] = []  # as if the map were long enough to be journaled as edits
    ns.punch(f, 50, 250)
    assert f.extent_list() == [(0, 50, 1, 0, 0, 100), (250, 50, 1, 8192, 50, 100)]
    assert ns.take_frees() == [(1, 4096, 100)]
    assert f.ino not in ns.extent_edits  # a hole is no edit: the next commit logs the map whole
    ns.punch(f, 20, 30)
    assert ns.refs == {(1, 0, 100): 2}


def test_release_frees_all_records(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.map_extent(f, (0, 10, 2, 0, 0, 10))
    ns.map_extent(f, (10, 10, 2, 4096, 0, 10))
    ns.unlink(ROOT, b"f")
    ns.release(f)
    assert sorted(ns.take_frees()) == [(2, 0, 10), (2, 4096, 10)]


def test_directory_entries_change_form_and_keep_every_name(ns):
    """A directory holds no name, one name in its own slot, a few names as one string in
    the arena, packed names, or a dict past PACKED_MAX bytes of names; every form answers
    the same."""
    t = ns.table
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    assert (t.kid[d.ino], d.ino in t.dirs) == (0, False) and ns.listdir(d.ino) == [] and not d.has_children()
    a = ns.create(d.ino, b"a", REG, 0, 0)
    assert (t.kid[d.ino], t.names.get(t.kname[d.ino]), d.ino in t.dirs) == (a.ino, b"a", False)
    assert ns.lookup(d.ino, b"a") == a and ns.lookup(d.ino, b"b") is None
    assert err(ns.create, d.ino, b"a", REG, 0, 0) == errno.EEXIST
    b = ns.create(d.ino, b"b", REG, 0, 0)
    assert t.kid[d.ino] == SMALL and d.ino not in t.dirs  # a few names: one string in the arena
    assert ns.listdir(d.ino) == [(b"a", a.ino), (b"b", b.ino)] and ns.lookup(d.ino, b"b") == b
    assert ns.lookup(d.ino, b"") is None and ns.lookup(d.ino, b"ab") is None
    c = ns.create(d.ino, b"c", REG, 0, 0)
    ns.unlink(d.ino, b"b")
    assert t.kid[d.ino] == SMALL and ns.listdir(d.ino) == [(b"a", a.ino), (b"c", c.ino)]
    ns.unlink(d.ino, b"c")  # one name left: back in the slot
    assert (t.kid[d.ino], t.names.get(t.kname[d.ino]), d.ino in t.dirs) == (a.ino, b"a", False)
    b = ns.create(d.ino, b"b", REG, 0, 0)
    hashes = [ns.create(d.ino, b"%032x" % i, REG, 0, 0) for i in range(7)]  # past SMALL_MAX: packed
    assert t.kid[d.ino] == 0 and type(t.dirs[d.ino]) is PackedEntries
    assert ns.listdir(d.ino) == [(b"a", a.ino), (b"b", b.ino)] + [(b"%032x" % i, h.ino) for i, h in enumerate(hashes)]
    many = hashes + [ns.create(d.ino, b"%032x" % i, REG, 0, 0) for i in range(7, PACKED_MAX // 33 + 1)]
    assert type(t.dirs[d.ino]) is dict and len(ns.listdir(d.ino)) == len(many) + 2  # past PACKED_MAX
    assert ns.lookup(d.ino, b"%032x" % 5) == many[5] and ns.lookup(d.ino, b"b") == b
    for i in range(len(many)):
        ns.unlink(d.ino, b"%032x" % i)
    assert type(t.dirs[d.ino]) is dict and sorted(ns.listdir(d.ino)) == [(b"a", a.ino), (b"b", b.ino)]
    ns.rename(d.ino, b"b", d.ino, b"a")  # replaces a: one name left
    assert (t.kid[d.ino], t.names.get(t.kname[d.ino]), d.ino in t.dirs) == (b.ino, b"a", False)
    assert ns.lookup(d.ino, b"a") == b
    assert err(ns.rmdir, ROOT, b"d") == errno.ENOTEMPTY
    ns.unlink(d.ino, b"a")
    assert (t.kid[d.ino], t.kname[d.ino], d.ino in t.dirs) == (0, 0, False) and ns.listdir(d.ino) == []
    ns.rmdir(ROOT, b"d")
    assert ns.lookup(ROOT, b"d") is None


def test_large_xattrs_are_stored_compressed_and_read_back_exactly(ns):
    import os
    import pickle

    from packfs.namespace.xattrblob import XATTR_COMPRESS_MIN, pack_xattrs, unpack_xattrs
    f = ns.create(ROOT, b"f", REG, 0, 0)
    meta = pickle.dumps({"name": "/AUTH_test/c/o", "X-Timestamp": "1763872345.12345", "ETag": "0" * 32,
                         "Content-Type": "application/octet-stream", "Content-Length": "4096"}, protocol=2)
    noise = os.urandom(300)  # incompressible: stays plain
    ns.setxattr(f.ino, b"user.swift.metadata", meta)
    ns.setxattr(f.ino, b"user.small", b"v")
    assert meta in f.row()[11]  # setxattr stores them plain: compressing is left to the background
    assert ns.getxattr(f.ino, b"user.swift.metadata") == meta
    assert ns.table.compress_xattrs(limit=1) is False  # one inode was waiting, none is left
    stored = f.row()[11]
    assert len(stored) < len(meta) // 2 + XATTR_COMPRESS_MIN // 2  # compressed well
    assert ns.getxattr(f.ino, b"user.swift.metadata") == meta
    assert sorted(ns.listxattr(f.ino)) == [b"user.small", b"user.swift.metadata"]
    assert unpack_xattrs(stored) == {b"user.swift.metadata": meta, b"user.small": b"v"}
    plain = pack_xattrs({b"user.n": noise})
    assert noise in plain and unpack_xattrs(plain) == {b"user.n": noise}
    short = pack_xattrs({b"user.a": b"b"})
    assert len(short) < XATTR_COMPRESS_MIN and unpack_xattrs(short) == {b"user.a": b"b"}
    ns.removexattr(f.ino, b"user.swift.metadata")  # editing a compressed blob
    assert ns.listxattr(f.ino) == [b"user.small"] and ns.getxattr(f.ino, b"user.small") == b"v"


def test_the_background_compressor_leaves_xattrs_for_two_turns(ns):
    """Swift sets its metadata, then its checksum, often with another PUT's commit (a turn
    of the compressor) in between: compressing the first alone would mean decompressing
    and compressing again for the second. Each turn leaves what was set in it or in the
    turn before; a checkpoint's compression takes everything."""
    import pickle

    from packfs.namespace.xattrblob import is_compressed
    f = ns.create(ROOT, b"f", REG, 0, 0)
    meta = pickle.dumps({"name": "/AUTH_test/c/o", "X-Timestamp": "1763872345.12345"}, protocol=2) * 4
    ns.setxattr(f.ino, b"user.swift.metadata", meta)
    assert ns.table.compress_xattrs(settled_only=True) is False  # nothing left to do this turn...
    assert not is_compressed(f.row()[11])  # ...and the blob is still plain
    ns.table.next_compress_turn()
    ns.setxattr(f.ino, b"user.swift.metadata_checksum", b"%032x" % 7)  # the second, a turn later
    for _ in range(2):
        assert ns.table.compress_xattrs(settled_only=True) is False
        assert not is_compressed(f.row()[11])
        ns.table.next_compress_turn()
    assert ns.table.compress_xattrs(settled_only=True) is False
    assert is_compressed(f.row()[11])  # two turns after its last change
    assert ns.getxattr(f.ino, b"user.swift.metadata") == meta
    g = ns.create(ROOT, b"g", REG, 0, 0)
    ns.setxattr(g.ino, b"user.swift.metadata", meta)
    ns.table.compress_xattrs(settled_only=True)
    ns.table.compress_xattrs()  # a checkpoint's: the catalog gets them small
    assert is_compressed(g.row()[11])


def test_xattr_arena_space_is_reused_as_swift_rewrites_metadata(ns):
    """Each compression frees the blob it replaces; the next blob of that size class takes
    its place, so rewriting metadata barely grows the arena. The plain blobs setxattr
    stores wait outside it, and leave no free space in it."""
    files = [ns.create(ROOT, b"f%d" % i, REG, 0, 0) for i in range(20)]
    for rnd in range(50):
        for f in files:
            meta = b"{'X-Timestamp': '17638%05d.12345', 'ETag': '%032x'}" % (rnd, f.ino) * 4
            ns.setxattr(f.ino, b"user.swift.metadata", meta)
            ns.setxattr(f.ino, b"user.swift.metadata_checksum", b"%032x" % rnd)
        assert ns.table.xblobs.used == RESERVED_REFS * XATTR_GRAIN  # the old values freed, the new ones not in it yet
        ns.table.compress_xattrs()
    # Compressed sizes vary a little from round to round, so a new size class sometimes
    # takes fresh space; without reuse the arena would be some 50 times the live values.
    assert len(ns.table.xblobs.data) < 2 * ns.table.xblobs.used
    assert ns.getxattr(files[7].ino, b"user.swift.metadata_checksum") == b"%032x" % 49
    ns.release(ns.unlink(ROOT, b"f7"))
    live = [ns.table.packed_xattrs(f.ino) for f in files if f.ino != files[7].ino]
    # Each blob with its length in front (one byte below 128, two below 16,384), in whole
    # grains, and the arena's first grains (no string's).
    assert all(len(x) < 16384 for x in live)
    grains = sum(-(-(len(x) + 1 + (len(x) >= 128)) // XATTR_GRAIN) for x in live)
    assert ns.table.xblobs.used == (RESERVED_REFS + grains) * XATTR_GRAIN


def test_one_inodes_xattrs_are_limited_in_all(ns, monkeypatch):
    monkeypatch.setattr("packfs.namespace.namespace.XATTRS_MAX", 300_000)
    f = ns.create(ROOT, b"f", REG, 0, 0)
    for i in range(4):
        ns.setxattr(f.ino, b"user.%d" % i, bytes(65536))
    with pytest.raises(FsError) as e:
        for i in range(4, 8):
            ns.setxattr(f.ino, b"user.%d" % i, bytes(65536))
    assert e.value.errno == errno.ENOSPC and i == 4
    assert len(ns.listxattr(f.ino)) == 4 and ns.getxattr(f.ino, b"user.3") == bytes(65536)


def test_inode_numbers_stay_below_the_columns_limit(ns):
    from packfs.namespace.inodes import INO_MAX
    ns.next_ino = INO_MAX  # every number below is taken (none is free to reuse)
    with pytest.raises(FsError) as e:
        ns.create(ROOT, b"one-too-many", REG, 0, 0)
    assert e.value.errno == errno.ENOSPC and ns.lookup(ROOT, b"one-too-many") is None


def swift_xattrs(**metadata: str) -> dict[bytes, bytes]:
    """The two xattrs Swift 2.38 sets on an object under Python 3 (diskfile.write_metadata)."""
    import hashlib
    import pickle

    from swift.obj.diskfile import PICKLE_PROTOCOL, _encode_metadata
    meta = pickle.dumps(_encode_metadata(metadata), PICKLE_PROTOCOL)
    return {b"user.swift.metadata": meta, b"user.swift.metadata_checksum": hashlib.md5(meta).hexdigest().encode()}


def test_swifts_metadata_is_stored_in_the_swift_form_and_formats_2_and_3_still_read():
    """Swift under Python 3 pickles its metadata with bytes keys and values (~440 B with
    the checksum). The Swift form keeps the dict's items and derives the checksum: a
    sixth of that. Blobs formats 2 and 3 compressed with their own dictionaries read back
    the same."""
    import zlib

    from packfs.namespace.xattrblob import _XZ_DICT_2, _XZ_DICT_3, pack_xattrs, unpack_xattrs
    xattrs = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "Content-Type": "application/octet-stream",
                             "Content-Length": "4096", "ETag": "3f9a" * 8, "name": "/AUTH_test/c/obj-000042"})
    plain = pack_xattrs(xattrs, compress=False)
    stored = pack_xattrs(xattrs)
    assert len(plain) > 420 and stored[:2] == b"\xff\xfd" and len(stored) < len(plain) // 6
    assert unpack_xattrs(stored) == xattrs
    for prefix, zdict in ((b"\xff\xff", _XZ_DICT_2), (b"\xff\xfe", _XZ_DICT_3)):
        c = zlib.compressobj(6, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
        assert unpack_xattrs(prefix + c.compress(plain) + c.flush()) == xattrs


def test_the_swift_form_keeps_every_pickle_and_xattr_exactly():
    """A tombstone, empty and repeated values, other xattrs around Swift's, a checksum
    that is not the pickle's MD5, metadata that is not a Swift pickle: each reads back
    byte for byte, in the Swift form where it applies, compressed otherwise."""
    import pickle
    import zlib

    from packfs.namespace.xattrblob import _XZ_DICT_4, pack_xattrs, unpack_xattrs
    assert zlib.crc32(_XZ_DICT_4) == 0x70375D71  # on-disk format: the dictionary never changes
    tomb = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/gone"})
    empties = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o", "Content-Length": "0",
                              "X-Object-Meta-A": "0", "X-Object-Meta-Empty": "", "X-Object-Meta-Twin": "0"})
    wrong_sum = {**tomb, b"user.swift.metadata_checksum": b"0" * 32}
    others = {b"user.rsync.%stat": b"100644 0,0 0:0", **tomb, b"user.z": b"after"}
    after = {**swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o"}), b"user.z": b"z" * 200}
    str_pickle = {b"user.swift.metadata": pickle.dumps({"name": "/AUTH_test/c/o", "X-Timestamp": "1" * 16}, 2) * 2}
    evil = {b"user.swift.metadata": b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R." + b"." * 200}
    for xattrs, form in ((tomb, b"\xff\xfd"), (empties, b"\xff\xfd"), (wrong_sum, b"\xff\xfd"),
                         (after, b"\xff\xfd"), (others, b"\xff\xfe"), (str_pickle, b"\xff\xfe"), (evil, b"\xff\xfe")):
        stored = pack_xattrs(xattrs)
        assert stored[:2] == form and unpack_xattrs(stored) == xattrs
        assert list(unpack_xattrs(stored)) == list(xattrs)  # in their order


def test_a_blob_that_pickles_differently_or_is_damaged_fails_with_eio(monkeypatch):
    from packfs.namespace import xattrblob
    stored = xattrblob.pack_xattrs(swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o"}))
    monkeypatch.setattr(xattrblob, "_swiftform", None)  # the Python path (test_swiftform.py forges the C path's case)
    monkeypatch.setattr(xattrblob, "_PICKLE_PROTOCOL", 3)  # a pickler that writes other bytes
    with pytest.raises(FsError) as e:
        xattrblob.unpack_xattrs(stored)
    assert e.value.errno == errno.EIO
    monkeypatch.undo()
    assert xattrblob.unpack_xattrs(stored)[b"user.swift.metadata"]
    for damaged in (stored[:-3], b"\xff\xfd" + bytes(40), b"\xff\xfe" + b"\xfe" * 40):
        with pytest.raises(FsError) as e:
            xattrblob.unpack_xattrs(damaged)
        assert e.value.errno == errno.EIO


def test_decoded_xattrs_are_kept_for_the_next_read_and_never_stale(ns):
    xattrs = swift_xattrs(**{"X-Timestamp": "1763872345.12345", "name": "/AUTH_test/c/o"})
    f = ns.create(ROOT, b"f", REG, 0, 0)
    for name, value in xattrs.items():
        ns.setxattr(f.ino, name, value)
    ns.table.compress_xattrs()
    assert ns.getxattr(f.ino, b"user.swift.metadata_checksum") == xattrs[b"user.swift.metadata_checksum"]
    assert ns.table._decoded[f.ino][1] is ns.table.plain_xattrs(f.ino)  # the second read decodes nothing
    ns.setxattr(f.ino, b"user.swift.metadata_checksum", b"1" * 32)
    ns.table.compress_xattrs()
    assert ns.getxattr(f.ino, b"user.swift.metadata_checksum") == b"1" * 32


def test_values_of_ever_other_sizes_leave_the_xattr_arena_compacted_not_grown(ns, monkeypatch):
    """Replacing every value with one of another size frees runs that no later value
    fits: the arena is copied without them once they outweigh the values (and
    XATTR_COMPACT_MIN), and every reference, a directory's and one kept in the catalog's
    place (IN_CATALOG) too, still names its value."""
    import random

    from packfs.namespace import inodes, xattrstore
    monkeypatch.setattr(xattrstore, "XATTR_COMPACT_MIN", 1 << 20)
    rng = random.Random(3)
    holders = [ns.create(ROOT, b"f%d" % i, REG, 0, 0).ino for i in range(100)]
    holders += [ns.create(ROOT, b"d%d" % i, DIR, 0, 0).ino for i in range(30)]
    catalogued = ns.create(ROOT, b"in-catalog", REG, 0, 0).ino
    ns.table._set_xref(catalogued, inodes.IN_CATALOG)
    t = ns.table
    values: dict[int, bytes] = {}
    largest = compactions = 0
    for _ in range(30):
        for ino in holders:
            values[ino] = rng.randbytes(rng.randrange(200, 8000))  # incompressible: each in the arena as it is
            ns.setxattr(ino, b"user.x", values[ino])
        t.compress_xattrs()
        compactions += t.xattr_compaction_due()
        while t.compact_xattrs():
            pass
        largest = max(largest, len(t.xblobs.data))
    live = sum(map(len, values.values()))
    assert compactions >= 3 and largest < 2 * live + (1 << 20) + 8000 * len(holders), (compactions, largest, live)
    assert t.xblobs.wasted() <= max(t.xblobs.used, 1 << 20)
    for ino, value in values.items():
        assert ns.getxattr(ino, b"user.x") == value
    assert t.xref(catalogued) == inodes.IN_CATALOG
    assert not t.compact_xattrs() and not t.compacting_xattrs  # nothing due right after


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_compaction_in_parts_keeps_every_value_changed_between_its_parts(ns, monkeypatch, in_memory):
    """A compaction copies a few slots' values per part, and requests come in between:
    values set, replaced, removed, read and freed with their inodes, below the cursor
    (in the new arena) and past it (still in the old), and inodes made past the last
    slot, must all be right after every part and once the new arena has taken over.
    Without xattrs in memory, checkpoints free values the catalog then holds, too (a
    dict stands for the catalog here)."""
    import random

    from packfs.namespace import inodes, xattrstore
    monkeypatch.setattr(xattrstore, "XATTR_COMPACT_MIN", 1 << 16)
    rng = random.Random(5)
    t = ns.table
    t.keep_xattrs = in_memory
    catalog: dict[int, bytes | None] = {}
    t.fetch_xattrs = catalog.get
    values: dict[int, bytes] = {}

    def put(ino: int) -> None:
        values[ino] = rng.randbytes(rng.randrange(100, 3000))
        ns.setxattr(ino, b"user.x", values[ino])

    names: dict[int, bytes] = {}

    def make(name: bytes, mode: int) -> int:
        ino = ns.create(ROOT, name, mode, 0, 0).ino
        names[ino] = name
        return ino

    files = [make(b"f%d" % i, REG) for i in range(300)]
    dirs = [make(b"d%d" % i, DIR) for i in range(40)]
    for _ in range(10):  # every value again, in other sizes, until the free runs are due
        for ino in files + dirs:
            put(ino)
        t.compress_xattrs()
        if t.xattr_compaction_due():
            break
    assert t.xattr_compaction_due()
    made = 0
    parts = 0
    while t.compact_xattrs(slots=13, budget=20_000):
        parts += 1
        size, free = t.xattr_arena_bytes()
        assert 0 <= free < size
        for _ in range(5):
            ino = rng.choice(files + dirs)
            action = rng.randrange(5)
            if action == 4 and not in_memory:  # a checkpoint of this inode
                row = t.row(ino)
                catalog[ino] = row[11]
                t.checkpointed([row])
                assert row[11] is None or t.xref(ino) == inodes.IN_CATALOG  # its memory freed
            elif action == 0:
                put(ino)
            elif action == 1 and ino in values:
                ns.removexattr(ino, b"user.x")
                del values[ino]
            elif action == 2 and ino in files:
                ns.unlink(ROOT, names.pop(ino))
                files.remove(ino)
                values.pop(ino, None)
            else:
                made += 1
                new = make(b"n%d" % made, REG)
                files.append(new)
                put(new)
        t.compress_xattrs()
        for ino, value in values.items():
            assert ns.getxattr(ino, b"user.x") == value, (parts, ino)
    assert parts >= 10 and not t.compacting_xattrs
    for ino, value in values.items():
        assert ns.getxattr(ino, b"user.x") == value
    assert t.xblobs.wasted() < t.xblobs.used, t.xattr_arena_bytes()


def test_the_compressor_slice_ends_at_its_byte_budget_and_big_blobs_stay_plain(ns):
    """Any user may set 64 KiB values under many names: a slice of 64 such blobs held the
    loop 0.4 s, so a slice also ends once `budget` bytes are compressed, and a blob past
    XATTR_COMPRESS_MAX is not deflated at all."""
    from packfs.namespace.xattrblob import XATTR_COMPRESS_MAX, is_compressed, pack_xattrs
    files = [ns.create(ROOT, b"f%d" % i, REG, 0, 0).ino for i in range(10)]
    for ino in files:
        ns.setxattr(ino, b"user.x", b"%02d" % ino * 10_000)  # 20 KB, compressible
    t = ns.table
    assert t.compress_xattrs(limit=64, budget=64 << 10)
    assert t.uncompressed() == 6  # 4 blobs of ~20 KB passed the 64 KiB
    assert not t.compress_xattrs(limit=64, budget=1 << 20) and t.uncompressed() == 0
    for ino in files:
        assert is_compressed(t.packed_xattrs(ino)) and ns.getxattr(ino, b"user.x") == b"%02d" % ino * 10_000
    big = {b"user.a": b"a" * 40_000, b"user.b": b"b" * 40_000}
    stored = pack_xattrs(big)
    assert len(stored) > XATTR_COMPRESS_MAX and not is_compressed(stored)
