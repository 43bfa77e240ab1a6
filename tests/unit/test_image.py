"""The namespace image: it loads exactly the catalog's table, or is not used at all."""
from __future__ import annotations

import logging
import random
import shutil
import stat
from array import array

import pytest
from test_catalog import build, cat, checkpoint, dump  # noqa: F401 (cat is a fixture)
from test_recovery import (COMMITTED, Filesystem, lookup_path, make_committed, open_pack, packdir,  # noqa: F401
                           read_via_pack, run, write_file)

from packfs.namespace import image
from packfs.core.catalog import Catalog
from packfs.namespace.dirents import PACKED_MAX, PackedEntries
from packfs.namespace.inodes import IN_CATALOG, VOLUME_INDEXES, Inode
from packfs.namespace.namespace import ROOT, Namespace
from packfs.core.recovery import load_namespace

DIR = stat.S_IFDIR | 0o755


def saved(tmp_path, cat: Catalog, ns: Namespace) -> int:
    """Checkpoint ns, write its image and name it in the catalog; the token."""
    checkpoint(cat, ns)
    token = image.new_token()
    image.save(str(tmp_path), ns.table, token, cat.stamp)
    cat.set_image_token(token)
    return token


@pytest.mark.parametrize("in_memory", [True, False])
def test_image_loads_what_the_catalog_loads(tmp_path, cat, in_memory):
    ns = build()
    for n in range(50):  # inode numbers to reuse, and a directory of many names
        ns.create(ROOT, b"f%d" % n, stat.S_IFREG | 0o600, 0, 0)
    for n in range(0, 50, 3):
        ns.release(ns.unlink(ROOT, b"f%d" % n))
    checkpoint(cat, ns)
    from_catalog = load_namespace(cat, in_memory)
    token = image.new_token()
    image.save(str(tmp_path), from_catalog.table, token, cat.stamp)
    cat.set_image_token(token)

    table = image.take(str(tmp_path), cat.image_token, cat.stamp, in_memory)
    assert table is not None
    from_image = load_namespace(cat, in_memory, table)
    assert dump(from_image) == dump(from_catalog) == dump(ns)
    assert len(from_image) == len(ns) and from_image.next_ino == ns.next_ino
    assert from_image.refs == from_catalog.refs != {}
    assert from_image.table.xattrs_in_memory() == from_catalog.table.xattrs_in_memory()
    in_catalog = [from_catalog.table.xref(ino) == IN_CATALOG for ino in from_catalog.table.inos()]
    assert [from_image.table.xref(ino) == IN_CATALOG for ino in from_image.table.inos()] == in_catalog
    assert any(in_catalog) != in_memory
    # Both reuse the same free numbers, in the same order.
    for n in range(5):
        a = from_image.create(ROOT, b"new%d" % n, stat.S_IFREG | 0o600, 0, 0)
        b = from_catalog.create(ROOT, b"new%d" % n, stat.S_IFREG | 0o600, 0, 0)
        assert a.ino == b.ino < ns.next_ino


def test_packed_and_dict_directories_come_back(tmp_path, cat):
    """A partition-like directory (packed entries) and one past PACKED_MAX names (a dict)
    load from the image as they were."""
    ns = Namespace.fresh(0, 0)
    part = ns.create(ROOT, b"1023", DIR, 0, 0)
    suffixes = [b"%03x" % i for i in range(300)]
    for suffix in suffixes:
        ns.create(part.ino, suffix, DIR, 0, 0)
    flat = ns.create(ROOT, b"flat", DIR, 0, 0)
    hashes = [b"%032x" % i for i in range(PACKED_MAX // 32)]
    for h in hashes:
        ns.create(flat.ino, h, DIR, 0, 0)
    assert type(ns.table.dirs[part.ino]) is PackedEntries and type(ns.table.dirs[flat.ino]) is dict
    saved(tmp_path, cat, ns)
    loaded = load_namespace(cat, True, image.take(str(tmp_path), cat.image_token, cat.stamp, True))
    t = loaded.table
    assert type(t.dirs[part.ino]) is PackedEntries and type(t.dirs[flat.ino]) is dict
    assert sorted(t.children(part.ino)) == sorted(ns.table.children(part.ino))
    assert sorted(t.children(flat.ino)) == sorted(ns.table.children(flat.ino))
    assert loaded.lookup(part.ino, b"12b").ino == ns.lookup(part.ino, b"12b").ino
    assert loaded.lookup(flat.ino, hashes[-1]).ino == ns.lookup(flat.ino, hashes[-1]).ino


def test_one_name_entries_come_back_from_the_arena(tmp_path, cat):
    """A directory's single entry is a reference into the names arena: after a load, lookups
    find it, and a freed name's space is reused by the next name of its length. (Long
    names keep the root's entries out of the arena, and the arena's free space under
    1/32, so that the image is not compacted.)"""
    ns = Namespace.fresh(0, 0)
    dirs = [ns.create(ROOT, b"d%02d" % i + b"x" * 128, DIR, 0, 0) for i in range(60)]
    for i, d in enumerate(dirs):
        ns.create(d.ino, b"%0255x" % i, DIR, 0, 0)
    ns.rmdir(dirs[3].ino, b"%0255x" % 3)
    assert 0 < ns.table.names.wasted() <= len(ns.table.names.data) // 32
    saved(tmp_path, cat, ns)
    loaded = load_namespace(cat, True, image.take(str(tmp_path), cat.image_token, cat.stamp, True))
    t = loaded.table
    assert loaded.lookup(dirs[3].ino, b"%0255x" % 3) is None
    for i, d in enumerate(dirs):
        if i != 3:
            assert loaded.lookup(d.ino, b"%0255x" % i).ino == ns.lookup(d.ino, b"%0255x" % i).ino
    size = len(t.names.data)
    loaded.create(dirs[3].ino, b"%0255x" % 99, DIR, 0, 0)
    assert len(t.names.data) == size and loaded.lookup(dirs[3].ino, b"%0255x" % 99)


def test_no_image_is_written_while_xattrs_wait_to_be_compressed(tmp_path):
    """Every checkpoint compresses first; an image written before would miss the plain
    blobs held outside the xattr arena, so it is refused."""
    ns = Namespace.fresh(0, 0)
    f = ns.create(ROOT, b"f", stat.S_IFREG | 0o644, 0, 0)
    ns.setxattr(f.ino, b"user.swift.metadata", b"m" * 300)
    with pytest.raises(image.ImageError, match="compressed"):
        image.save(str(tmp_path), ns.table, image.new_token(), (0, 0, 0, 0))
    assert not (tmp_path / image.FILENAME).exists()
    ns.table.compress_xattrs()
    assert image.save(str(tmp_path), ns.table, image.new_token(), (0, 0, 0, 0)) > 0


def test_checkpoint_makes_the_image_stale(tmp_path, cat):
    ns = build()
    saved(tmp_path, cat, ns)
    assert cat.image_token
    ns.create(ROOT, b"after", stat.S_IFREG | 0o600, 0, 0)
    checkpoint(cat, ns)
    assert cat.image_token is None
    cat.close()
    assert Catalog(str(tmp_path / "catalog.sqlite")).image_token is None


def test_catalog_changed_by_a_packfs_without_images_is_not_taken_for_the_image(tmp_path, cat):
    """An older packfs checkpoints without clearing the token: the stamp still tells."""
    ns = build()
    token = saved(tmp_path, cat, ns)
    kept = tmp_path / "image.copy"
    shutil.copy(tmp_path / image.FILENAME, kept)
    ns.create(ROOT, b"written by an older packfs", stat.S_IFREG | 0o600, 0, 0)
    checkpoint(cat, ns, volume=1, offset=12288, seq=99)
    assert not (tmp_path / image.FILENAME).exists()  # this packfs's checkpoint removes it
    # What an older packfs leaves: it knows nothing of the token or the file.
    shutil.copy(kept, tmp_path / image.FILENAME)
    cat.set_image_token(token)
    with pytest.raises(image.ImageError, match="moved on"):
        image.load(str(tmp_path), token, cat.stamp, True)
    assert image.take(str(tmp_path), cat.image_token, cat.stamp, True) is None


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


DAMAGES = {
    "missing": (lambda p: p.unlink(), "there is none"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
    "flipped byte in the names": (lambda p: _flip(p, p.stat().st_size - 300), "damaged"),
    "flipped byte in a column": (lambda p: _flip(p, 89), "section is damaged"),  # the header, a section's, `mode`
    "flipped byte in the header": (lambda p: _flip(p, 20), "header is damaged"),
    "not an image": (lambda p: p.write_bytes(b"\0" * 4096), "not a packfs namespace image"),
    "trailing bytes": (lambda p: p.write_bytes(p.read_bytes() + b"x"), "after its last section"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_unusable_image_is_not_used(tmp_path, cat, caplog, damage):
    token = saved(tmp_path, cat, build())
    harm, reason = DAMAGES[damage]
    harm(tmp_path / image.FILENAME)
    with pytest.raises(image.ImageError, match=reason):
        image.load(str(tmp_path), token, cat.stamp, True)
    with caplog.at_level(logging.WARNING, logger="packfs.namespace.image"):
        assert image.take(str(tmp_path), token, cat.stamp, True) is None
    assert "loading the catalog instead" in caplog.text


def test_image_of_another_catalog_or_mode_is_not_used(tmp_path, cat):
    token = saved(tmp_path, cat, build())
    with pytest.raises(image.ImageError, match="stale"):
        image.load(str(tmp_path), token + 1, cat.stamp, True)
    with pytest.raises(image.ImageError, match="xattrs_in_memory"):
        image.load(str(tmp_path), token, cat.stamp, False)
    assert image.take(str(tmp_path), None, cat.stamp, True) is None  # the catalog names no image


# -- through open_pack, as a mount uses it -------------------------------------------


def _opened(packdir) -> tuple[str, int | None, bool]:
    """Open and close the pack without a checkpoint: (loaded from, image token, image file exists)."""
    p = open_pack(packdir)
    try:
        assert lookup_path(p, b"dir").xattrs == {b"user.k": b"v"}
        return p.loaded_from, p.catalog.image_token, (packdir / image.FILENAME).exists()
    finally:
        p.volumes.close()
        p.catalog.close()


def test_the_image_serves_until_the_first_checkpoint(packdir):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)

    run(packdir, body, clean=True, save_image=True)
    assert (packdir / image.FILENAME).exists()
    source, token, exists = _opened(packdir)
    assert source == "image" and token and exists  # no checkpoint yet: the catalog is unchanged
    assert _opened(packdir)[0] == "image"  # so a crash now recovers from the image again
    for name, data in COMMITTED.items():
        assert read_via_pack(packdir, name) == data  # each of these closes with a checkpoint
    assert _opened(packdir) == ("catalog", None, False)


def test_crash_after_an_image_mount_recovers_from_the_image_and_the_log(packdir):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)

    run(packdir, body, clean=True, save_image=True)

    async def more(fs: Filesystem) -> None:
        assert fs.pack.loaded_from == "image"
        await write_file(fs, ROOT, b"later", b"L" * 9000)
        fs.unlink(ROOT, b"a")
        await fs.fsync()

    run(packdir, more, clean=False)
    p = open_pack(packdir)  # no checkpoint since the image: recovery starts from it
    try:
        assert p.loaded_from == "image" and p.recovery.replayed >= 1
        assert lookup_path(p, b"a") is None and lookup_path(p, b"later").size == 9000
    finally:
        p.volumes.close()
        p.catalog.close()
    assert read_via_pack(packdir, b"later") == b"L" * 9000
    assert read_via_pack(packdir, b"a") is None
    assert read_via_pack(packdir, b"dir/b") == COMMITTED[b"dir/b"]


def test_stale_image_file_is_not_used(packdir, tmp_path):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)

    run(packdir, body, clean=True, save_image=True)
    old = tmp_path / "old.img"
    shutil.copy(packdir / image.FILENAME, old)

    async def change(fs: Filesystem) -> None:
        fs.unlink(ROOT, b"a")
        await write_file(fs, ROOT, b"new", b"N" * 5000)

    run(packdir, change, clean=True, save_image=True)
    shutil.copy(old, packdir / image.FILENAME)  # the image of an older catalog
    p = open_pack(packdir)
    try:
        assert p.loaded_from == "catalog"
        assert lookup_path(p, b"a") is None and lookup_path(p, b"new") is not None
    finally:
        p.volumes.close()
        p.catalog.close()


def test_image_of_an_arena_with_much_free_space_is_compacted(tmp_path, cat):
    """The values of deleted files leave their space free; the image keeps only the live
    strings, and every value reads back."""
    ns = Namespace.fresh(0, 0)
    files = [ns.create(ROOT, b"%032x" % i, stat.S_IFREG | 0o600, 0, 0) for i in range(200)]
    for f in files:
        ns.setxattr(f.ino, b"user.swift.metadata", b"{'ETag': '%032x', 'Content-Length': '4096'}" % f.ino * 3)
    ns.table.compress_xattrs()
    for f in files[::2]:
        ns.release(ns.unlink(ROOT, b"%032x" % files.index(f)))
    assert ns.table.xblobs.wasted() > len(ns.table.xblobs.data) // 3
    saved(tmp_path, cat, ns)
    loaded = load_namespace(cat, True, image.take(str(tmp_path), cat.image_token, cat.stamp, True)).table
    assert loaded.xblobs.wasted() == 0 == loaded.names.wasted()
    assert len(loaded.xblobs.data) == ns.table.xblobs.used
    for i, f in enumerate(files):
        assert loaded.packed_xattrs(f.ino) == (None if i % 2 == 0 else ns.table.packed_xattrs(f.ino))
        assert loaded.child(ROOT, b"%032x" % i) == (None if i % 2 == 0 else f.ino)


def test_directories_xattrs_come_back_from_a_compacted_image(tmp_path, cat):
    """A directory's xattrs are in `dir_xat` (its `kid` holds an entry): the image
    compacts the arena under them and the files' alike, and leaves the entries alone."""
    ns = Namespace.fresh(0, 0)
    dirs = [ns.create(ROOT, b"d%02d" % i, DIR, 0, 0) for i in range(50)]
    files = [ns.create(d.ino, b"only", stat.S_IFREG | 0o600, 0, 0) for d in dirs]
    for d, f in zip(dirs, files):
        ns.setxattr(d.ino, b"user.a", b"%040x" % d.ino)
        ns.setxattr(f.ino, b"user.b", b"%040x" % f.ino)
    for d in dirs[::2]:
        ns.removexattr(d.ino, b"user.a")
    assert ns.table.xblobs.wasted() > len(ns.table.xblobs.data) // 32
    saved(tmp_path, cat, ns)
    table = image.take(str(tmp_path), cat.image_token, cat.stamp, True)
    assert table is not None
    loaded = load_namespace(cat, True, table)
    assert loaded.table.xblobs.wasted() == 0 and len(loaded.table.dir_xat) == 25
    assert [loaded.table.plain_xattrs(n.ino) for n in dirs + files] == \
        [ns.table.plain_xattrs(n.ino) for n in dirs + files]
    assert [loaded.listdir(d.ino) for d in dirs] == [[(b"only", f.ino)] for f in files]
    assert dump(loaded) == dump(ns)


def test_an_image_written_while_the_arena_is_compacted_finishes_the_compaction_first(tmp_path, cat, monkeypatch):
    """An unmount may come between two parts of a compaction of the xattr arena, with
    values in both arenas: the image is written once the compaction is done, and every
    value, a directory's too, reads back."""
    from packfs.namespace import inodes, xattrstore
    monkeypatch.setattr(xattrstore, "XATTR_COMPACT_MIN", 1 << 10)
    ns = Namespace.fresh(0, 0)
    dirs = [ns.create(ROOT, b"d%02d" % i, DIR, 0, 0) for i in range(20)]
    files = [ns.create(d.ino, b"only", stat.S_IFREG | 0o600, 0, 0) for d in dirs]
    t = ns.table
    for size in (300, 200, 100):  # each size frees the last: no later value fits those runs
        for n in dirs + files:
            ns.setxattr(n.ino, b"user.a", random.Random(n.ino).randbytes(size))  # incompressible
        t.compress_xattrs()
    assert t.compact_xattrs(slots=15) and t.compacting_xattrs  # some of the values moved
    saved(tmp_path, cat, ns)
    assert not t.compacting_xattrs
    loaded = load_namespace(cat, True, image.take(str(tmp_path), cat.image_token, cat.stamp, True))
    assert [loaded.table.plain_xattrs(n.ino) for n in dirs + files] == [t.plain_xattrs(n.ino) for n in dirs + files]
    assert [loaded.table.plain_xattrs(n.ino) for n in dirs + files] == \
        [inodes.pack_xattrs({b"user.a": random.Random(n.ino).randbytes(100)}) for n in dirs + files]
    assert dump(loaded) == dump(ns)


def test_compacting_xattrs_leaves_the_inodes_whose_values_only_the_catalog_holds(tmp_path, cat):
    """Without xattrs_in_memory a checkpoint frees the values the catalog now holds (their
    `xat` becomes IN_CATALOG, which names no arena string): the image compacts the arena
    around them, and every value reads back, from the arena or from the catalog."""
    ns = Namespace.fresh(0, 0)
    ns.table.keep_xattrs = False
    files = [ns.create(ROOT, b"%032x" % i, stat.S_IFREG | 0o600, 0, 0) for i in range(200)]
    for f in files:
        ns.setxattr(f.ino, b"user.a", b"%040x" % f.ino)
    checkpoint(cat, ns)
    t = ns.table
    t.fetch_xattrs = cat.xattrs_of
    t.checkpointed([t.row(f.ino) for f in files[10:]])  # as the journal does after a checkpoint
    assert t.xattrs_in_memory() == 10 and t.xblobs.wasted() > len(t.xblobs.data) // 2
    saved(tmp_path, cat, ns)
    table = image.take(str(tmp_path), cat.image_token, cat.stamp, False)
    assert table is not None
    loaded = load_namespace(cat, False, table).table
    assert loaded.xattrs_in_memory() == 10 and loaded.xblobs.wasted() == 0
    assert [loaded.xref(f.ino) == IN_CATALOG for f in files] == [False] * 10 + [True] * 190
    assert [loaded.plain_xattrs(f.ino) for f in files] == [t.plain_xattrs(f.ino) for f in files]


@pytest.mark.parametrize("wide", [False, True])
def test_compacting_names_keeps_the_records_files_hold_in_the_same_column(tmp_path, cat, wide):
    """A file's whole record lives in `kname`, where a directory keeps its name's reference:
    compacting the names arena must move the names and leave the records alone, in the
    u32 column or in the i64 one that more than 4,095 volume indexes make."""
    ns = Namespace.fresh(0, 0)
    if wide:
        ns.table.set_volumes(array("I", range(VOLUME_INDEXES)))  # as if every index were taken
    dirs = [ns.create(ROOT, b"d%03d" % i, stat.S_IFDIR | 0o755, 0, 0) for i in range(64)]
    files = []
    vol = (1 << 31) if wide else 1
    for i, d in enumerate(dirs):
        f = ns.create(d.ino, b"%032x" % i, stat.S_IFREG | 0o644, 0, 0)
        ns.map_extent(f, (0, 4096, vol + i, (i + 1) << 20, 0, 4096))
        f.size = 4096
        files.append(f)
    assert ns.table.kname.typecode == ("q" if wide else "I") and not ns.table.extents
    for i in range(0, 64, 2):  # frees half the names: the image compacts the arena
        ns.release(ns.unlink(dirs[i].ino, b"%032x" % i))
    assert ns.table.names.wasted() > len(ns.table.names.data) // 32
    saved(tmp_path, cat, ns)
    table = image.take(str(tmp_path), cat.image_token, cat.stamp, True)
    assert table is not None
    loaded = load_namespace(cat, True, table).table
    assert loaded.names.wasted() == 0 and loaded.kname.typecode == ns.table.kname.typecode
    for i in range(1, 64, 2):
        assert loaded.child(dirs[i].ino, b"%032x" % i) == files[i].ino
        assert loaded.extent_list(files[i].ino) == [(0, 4096, vol + i, (i + 1) << 20, 0, 4096)]
    from_catalog = load_namespace(cat, True).table  # indexes only the volumes in use
    assert from_catalog.kname.typecode == "I" and len(from_catalog.volumes) == 33
    assert [from_catalog.extent_list(f.ino) for f in files[1::2]] == [loaded.extent_list(f.ino) for f in files[1::2]]


@pytest.mark.parametrize("kinds", [3, 300, 70_000])
def test_kinds_come_back_from_the_image(tmp_path, cat, kinds):
    """The kind column is u8, u16 once a table has more than 256 (mode, uid, gid, nlink)
    kinds, u32 past 65,536."""
    ns = Namespace.fresh(0, 0)
    for uid in range(kinds):
        ns.table.kind_of(stat.S_IFREG | 0o644, uid, uid + 1, 1)
    files = [ns.create(ROOT, b"f%d" % i, stat.S_IFREG | 0o644, uid, uid + 1)
             for i, uid in enumerate((0, 1, kinds - 1))]
    files[1].mode = stat.S_IFREG | 0o600
    saved(tmp_path, cat, ns)
    table = image.take(str(tmp_path), cat.image_token, cat.stamp, True)
    assert table is not None
    loaded = load_namespace(cat, True, table).table
    assert loaded.kind.typecode == ("B" if kinds <= 255 else "H" if kinds < 1 << 16 else "I")
    for f, uid in zip(files, (0, 1, kinds - 1)):
        assert loaded.stat(f.ino)[:4] == (f.mode, 1, uid, uid + 1)


@pytest.mark.parametrize("whole", [False, True])
def test_times_and_xattrs_come_back_from_the_image(tmp_path, cat, whole):
    """`atime` and `ctime` hold distances from mtime, with far ones kept whole beside them
    (and the far entries no slot uses), or whole times once many are far; `kid` is u32,
    or i64 past 32 GiB of xattr values. Either way, every time and value comes back
    exactly, and a far time freed before the image is reused after it."""
    ns = Namespace.fresh(0, 0)
    files = [ns.create(ROOT, b"f%d" % i, stat.S_IFREG | 0o644, 0, 0) for i in range(4)]
    for i, f in enumerate(files):
        ns.setxattr(f.ino, b"user.swift.metadata", b"m%d" % i * (60 * i + 1))
    files[3].set_times(1, 10**18, 3)  # two far times, freed next: spare entries
    files[1].set_times(-5, 4_102_444_800_000_000_001, 7)  # both far: kept whole
    files[2].set_times(10, 20, 30)
    files[3].set_times(10, 10, 10)
    if whole:
        ns.table.atimes._go_whole()
        ns.table.ctimes._go_whole()
        ns.table._wide_kid()
    times = {f.ino: f.times() for f in files}
    saved(tmp_path, cat, ns)
    table = image.take(str(tmp_path), cat.image_token, cat.stamp, True)
    assert table is not None
    loaded = load_namespace(cat, True, table).table
    assert (loaded.atime.typecode, loaded.ctime.typecode, loaded.kid.typecode) == \
        (("q", "q", "q") if whole else ("I", "I", "I"))
    assert [loaded.plain_xattrs(f.ino) for f in files] == [ns.table.plain_xattrs(f.ino) for f in files]
    assert {ino: loaded.times(ino) for ino in times} == times
    far = [(t.far_count(), len(t.far)) for t in (loaded.atimes, loaded.ctimes)]
    assert far == ([(0, 0), (0, 0)] if whole else [(1, 2), (1, 2)])
    files = [Inode(loaded, f.ino) for f in files]
    files[2].set_times(30, 20, 10**18)  # far again: the spare entries are reused
    assert files[2].times() == (30, 20, 10**18) and files[1].times() == times[files[1].ino]
    if not whole:
        assert [(t.far_count(), len(t.far)) for t in (loaded.atimes, loaded.ctimes)] == [(2, 2), (2, 2)]
