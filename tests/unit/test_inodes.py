"""The inode table's columns: slots, rows, reuse of inode numbers, bulk loading."""
import stat
import tempfile
from array import array

import pytest
from test_catalog import build

from packfs.namespace import inodes
from packfs.store import records
from packfs.store.extents import pack as pack_extents
from packfs.namespace.inodes import IN_CATALOG, KINDS_NARROW, ROOT, Inode, InodeTable
from packfs.namespace.offsettimes import FAR
from packfs.namespace.namespace import Namespace
from packfs.namespace.xattrblob import is_compressed, pack_xattrs, plain
from packfs.namespace.arena import RESERVED_REFS
from packfs.namespace.xattrstore import XATTR_GRAIN

REG = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755


@pytest.fixture
def ns():
    return Namespace.fresh()


def sample_rows() -> list[tuple]:
    """One of each kind of inode, with every optional field used somewhere."""
    return [
        (ROOT, DIR, 0, 0, 3, 0, 1, 1, 1, 0, None, None, None, ROOT),
        (2, REG, 1000, 1000, 1, 4096, 5, 6, 7, 0, None, pack_xattrs({b"user.a": b"x" * 300}),
         pack_extents([(0, 4096, 1, 0, 0, 4096)]), 0),
        (3, stat.S_IFLNK | 0o777, 0, 0, 1, 4, 1, 1, 1, 0, b"/tmp", None, None, 0),
        (4, stat.S_IFCHR | 0o600, 0, 0, 1, 0, 1, 1, 1, 0x0501, None, None, None, 0),
        (6, DIR, 0, 0, 2, 0, -5, 2, 3, 0, None, pack_xattrs({b"user.d": b"1"}), None, ROOT),
        (7, REG, 0, 0, 1, 0, 1, 1, 1, 0, None, None, b"", 0),
    ]


def test_rows_load_and_come_back_unchanged():
    t = InodeTable()
    for row in sample_rows():
        t.load(row)
    assert [t.row(r[0]) for r in sample_rows()] == sample_rows()
    assert len(t) == 6 and list(t.inos()) == [1, 2, 3, 4, 6, 7]


def in_memory(t: InodeTable) -> dict[int, bytes]:
    """The packed xattrs a table holds in memory, by inode."""
    held = {ino: t.packed_xattrs(ino) for ino in t.inos() if t.xref(ino) != IN_CATALOG}
    return {ino: x for ino, x in held.items() if x is not None}


def catalog_form(row: tuple) -> tuple:
    """A row as Catalog.inode_rows gives it: whether there are xattrs, not what they are."""
    return row[:11] + (int(row[11] is not None),) + row[12:]


@pytest.mark.parametrize("keep_xattrs", [True, False])
def test_bulk_load_matches_row_by_row_load(keep_xattrs):
    one, bulk = InodeTable(), InodeTable()
    for row in sample_rows():
        one.load(row)
    bulk.keep_xattrs = keep_xattrs
    in_catalog = {r[0]: r[11] for r in sample_rows()}
    if keep_xattrs:
        bulk.load_all(iter(sample_rows()), 8)
        assert in_memory(bulk) == {i: x for i, x in in_catalog.items() if x}
    else:
        bulk.load_all(map(catalog_form, sample_rows()), 8)
        bulk.fetch_xattrs = in_catalog.__getitem__
        assert in_memory(bulk) == {} and bulk.xattrs_in_memory() == 0
        assert {ino for ino in bulk.inos() if bulk.xref(ino) == IN_CATALOG} == {i for i, x in in_catalog.items() if x}
        assert bulk.dir_xat == {6: IN_CATALOG}  # a directory's `kid` holds its entry
    bulk.load_entries([(ROOT, b"f", 2), (ROOT, b"l", 3), (6, b"only", 7)])
    for r in sample_rows():
        assert bulk.row(r[0]) == one.row(r[0])
    assert len(bulk) == len(one) == 6
    assert sorted(bulk.children(ROOT)) == [(b"f", 2), (b"l", 3)] and bulk.children(6) == [(b"only", 7)]
    assert bulk.child(6, b"only") == 7 and bulk.child(6, b"other") is None


def test_columns_grow_past_their_first_size(ns):
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    made = [ns.create(d.ino, b"%d" % i, REG, 0, 0) for i in range(5000)]
    made[-1].size = 1 << 40
    assert len(ns.table.kind) > made[-1].ino and len(ns) == 5002
    assert ns.lookup(d.ino, b"4999") == made[-1] and ns.get(made[-1].ino).size == 1 << 40


def test_a_freed_inode_number_is_reused_clean(ns):
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    f = ns.create(d.ino, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.x", b"1")
    ns.map_extent(f, (0, 10, 1, 0, 0, 10))
    f.size, f.opens, f.lookups = 10, 1, 2
    ns.unlink(d.ino, b"f")
    f.opens = f.lookups = 0
    assert ns.release(f)
    g = ns.create(ROOT, b"g", stat.S_IFDIR | 0o700, 5, 6)
    assert g.ino == f.ino  # the last number freed is the first reused
    assert (g.uid, g.gid, g.nlink, g.size, g.opens, g.lookups) == (5, 6, 2, 0, 0, 0)
    assert g.xattr_names() == [] and g.extents is None and ns.listdir(g.ino) == []
    h = ns.create(ROOT, b"h", REG, 0, 0)
    assert h.ino == ns.next_ino - 1 and h.extent_list() == []


def test_free_numbers_are_found_after_a_load_and_skipped_once_replay_takes_them():
    t = InodeTable()
    for row in sample_rows():
        t.load(row)
    ns = Namespace()
    ns.table, ns.next_ino = t, 9
    ns.loaded()
    assert sorted(t.free) == [5, 8]
    t.load((8, REG, 0, 0, 1, 0, 1, 1, 1, 0, None, None, b"", 0))  # a replayed commit created 8
    assert ns.create(ROOT, b"new", REG, 0, 0).ino == 5
    assert ns.create(ROOT, b"newer", REG, 0, 0).ino == 9  # 8 is in use, so a new number


def test_a_directory_row_keeps_its_entries_and_a_file_row_drops_them():
    t = InodeTable()
    t.load((ROOT, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT))
    t.load((2, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT))
    t.set_child(2, b"a", 3)
    t.set_child(2, b"b", 4)
    t.load((2, DIR | 0o022, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT))
    assert sorted(t.children(2)) == [(b"a", 3), (b"b", 4)]
    t.load((2, REG, 0, 0, 1, 0, 1, 1, 1, 0, None, None, b"", 0))
    assert t.children(2) == [] and 2 not in t.dirs


def test_a_directory_keeps_its_xattrs_beside_its_entries(ns):
    """A directory's `kid` holds its entry, so its xattrs are in `dir_xat`, and anything
    else's in its `kid`: entries and xattrs never read as each other, through changes,
    a checkpoint that leaves the values in the catalog, and a drop."""
    t = ns.table
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    f = ns.create(d.ino, b"f", REG, 0, 0)
    ns.setxattr(d.ino, b"user.d", b"dir")
    ns.setxattr(f.ino, b"user.f", b"file")
    assert t.kid[d.ino] == f.ino and list(t.dir_xat) == [d.ino] and t.kid[f.ino] == t.xref(f.ino) > IN_CATALOG
    assert ns.lookup(d.ino, b"f") == f and ns.getxattr(d.ino, b"user.d") == b"dir"
    g = ns.create(d.ino, b"g", REG, 0, 0)  # two names: one arena string
    assert sorted(ns.listdir(d.ino)) == sorted([(b"f", f.ino), (b"g", g.ino)])
    assert ns.getxattr(d.ino, b"user.d") == b"dir" and ns.getxattr(f.ino, b"user.f") == b"file"
    assert t.xattrs_in_memory() == 2
    t.keep_xattrs = False
    t.fetch_xattrs = {d.ino: t.packed_xattrs(d.ino), f.ino: t.packed_xattrs(f.ino)}.get
    t.checkpointed([t.row(d.ino), t.row(f.ino)])
    assert (t.dir_xat, t.kid[f.ino], t.xattrs_in_memory()) == ({d.ino: IN_CATALOG}, IN_CATALOG, 0)
    assert ns.getxattr(d.ino, b"user.d") == b"dir" and ns.getxattr(f.ino, b"user.f") == b"file"
    ns.removexattr(d.ino, b"user.d")
    assert d.ino not in t.dir_xat and Inode(t, d.ino).xattr_names() == [] and len(ns.listdir(d.ino)) == 2
    ns.setxattr(d.ino, b"user.e", b"again")
    used = t.xblobs.used
    for name in (b"f", b"g"):
        ns.release(ns.unlink(d.ino, name))
    ns.rmdir(ROOT, b"d")
    assert ns.release(d) and not t.dir_xat and t.xblobs.used < used


def test_views_compare_by_inode_number(ns):
    f = ns.create(ROOT, b"f", REG, 0, 0)
    again = Inode(ns.table, f.ino)
    assert again == f and again is not f and hash(again) == hash(f)
    f.mtime = 123
    assert again.mtime == 123  # both read the one slot
    assert ns.lookup(ROOT, b"f") == f and ns.lookup(ROOT, b".") != f


class FakeCatalog:
    """The xattrs a catalog holds, and how often they were read."""

    def __init__(self) -> None:
        self.xattrs: dict[int, bytes | None] = {}
        self.reads = 0

    def serve(self, t: InodeTable) -> "FakeCatalog":
        """Be the catalog a table leaves its xattr values in (noxattrs_in_memory)."""
        t.keep_xattrs = False
        t.fetch_xattrs = self.fetch
        return self

    def fetch(self, ino: int) -> bytes | None:
        self.reads += 1
        return self.xattrs.get(ino)

    def checkpoint(self, t: InodeTable, inos: list[int]) -> list[tuple]:
        rows = [t.row(i) for i in inos]
        self.xattrs.update((r[0], r[11]) for r in rows)
        return rows


def test_checkpointed_xattrs_stay_in_memory_by_default(ns):
    cat = FakeCatalog()
    ns.table.fetch_xattrs = cat.fetch
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.swift.metadata", b"m" * 300)
    ns.table.checkpointed(cat.checkpoint(ns.table, [f.ino]))
    assert ns.getxattr(f.ino, b"user.swift.metadata") == b"m" * 300 and f.ino in in_memory(ns.table)
    assert cat.reads == 0


def test_checkpointed_xattrs_leave_memory_and_are_read_from_the_catalog(ns):
    cat = FakeCatalog().serve(ns.table)
    f = ns.create(ROOT, b"f", REG, 0, 0)
    g = ns.create(ROOT, b"g", REG, 0, 0)
    ns.setxattr(f.ino, b"user.swift.metadata", b"m" * 300)
    rows = cat.checkpoint(ns.table, [f.ino, g.ino])
    ns.table.checkpointed(rows)
    assert in_memory(ns.table) == {} and cat.reads == 0
    for _ in range(5):  # a GET reads them several times: one catalog read
        assert ns.getxattr(f.ino, b"user.swift.metadata") == b"m" * 300
    assert cat.reads == 1 and g.xattr_names() == [] and cat.reads == 1  # g has none: never read
    assert f.row()[11] == cat.xattrs[f.ino]


def test_a_change_while_the_checkpoint_is_written_stays_in_memory(ns):
    cat = FakeCatalog().serve(ns.table)
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.a", b"old")
    rows = cat.checkpoint(ns.table, [f.ino])
    ns.setxattr(f.ino, b"user.a", b"new")  # after the rows were taken, before the commit
    ns.table.checkpointed(rows)
    assert ns.getxattr(f.ino, b"user.a") == b"new" and cat.reads == 0
    ns.removexattr(f.ino, b"user.a")
    ns.table.checkpointed(cat.checkpoint(ns.table, [f.ino]))
    assert ns.listxattr(f.ino) == [] and cat.reads == 0


def test_a_reused_inode_number_never_sees_the_catalogs_xattrs_of_the_old_inode(ns):
    cat = FakeCatalog().serve(ns.table)
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.a", b"old inode")
    ns.table.checkpointed(cat.checkpoint(ns.table, [f.ino]))
    ns.unlink(ROOT, b"f")
    ns.release(f)
    g = ns.create(ROOT, b"g", REG, 0, 0)
    assert g.ino == f.ino and g.xattr_names() == [] and g.row()[11] is None and cat.reads == 0


def test_xattrs_read_off_the_event_loop_are_kept_only_if_nothing_changed_meanwhile(ns):
    """Filesystem reads a file's checkpointed xattrs in a worker thread (keep_fetched): a
    change, or a freed slot, while that read was out makes its result untrustworthy."""
    cat = FakeCatalog().serve(ns.table)
    t = ns.table
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.a", b"old")
    t.checkpointed(cat.checkpoint(t, [f.ino]))
    assert t.xattrs_to_fetch(f.ino)
    epoch, x = t.xattr_epoch, t.fetch_xattrs(f.ino)  # the read goes out...
    ns.setxattr(f.ino, b"user.a", b"new")  # ...the value changes and is checkpointed...
    t.checkpointed(cat.checkpoint(t, [f.ino]))
    t.keep_fetched(f.ino, x, epoch)  # ...and the old value comes back: not kept
    assert t.xattrs_to_fetch(f.ino) and ns.getxattr(f.ino, b"user.a") == b"new"

    g = ns.create(ROOT, b"g", REG, 0, 0)
    ns.setxattr(g.ino, b"user.a", b"g's")
    t.checkpointed(cat.checkpoint(t, [g.ino]))
    epoch, x = t.xattr_epoch, t.fetch_xattrs(g.ino)
    ns.unlink(ROOT, b"g")
    ns.release(g)
    h = ns.create(ROOT, b"h", REG, 0, 0)  # g's number, reused
    ns.setxattr(h.ino, b"user.a", b"h's")
    t.checkpointed(cat.checkpoint(t, [h.ino]))
    t.keep_fetched(h.ino, x, epoch)
    assert h.ino == g.ino and ns.getxattr(h.ino, b"user.a") == b"h's"

    epoch, x = t.xattr_epoch, t.fetch_xattrs(f.ino)  # nothing changes meanwhile: kept
    t.keep_fetched(f.ino, x, epoch)
    reads = cat.reads
    assert not t.xattrs_to_fetch(f.ino) and ns.getxattr(f.ino, b"user.a") == b"new" and cat.reads == reads


def test_replayed_rows_override_the_catalogs_xattrs():
    t = InodeTable()
    cat = FakeCatalog().serve(t)
    cat.xattrs[2] = pack_xattrs({b"user.a": b"checkpointed"})
    t.load_all([catalog_form(r) for r in sample_rows()[:2]], 3)
    t.load((2, REG, 0, 0, 1, 0, 1, 1, 1, 0, None, pack_xattrs({b"user.a": b"replayed"}), b"", 0))
    assert Inode(t, 2).getxattr(b"user.a") == b"replayed"
    t.load((2, REG, 0, 0, 1, 0, 1, 1, 1, 0, None, None, b"", 0))
    assert Inode(t, 2).getxattr(b"user.a") is None and cat.reads == 0


def test_a_file_written_whole_in_one_record_keeps_its_map_in_columns(ns):
    """As the write path does it: the size first (at write), then the record (at flush).
    The record's length is the file's size, so a size that moves away from it (a
    truncate past the end) takes the map to a dict entry, and one that comes back, back."""
    t = ns.table
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.map_extent(f, (0, 4096, 3, 1 << 30, 0, 4096))  # longer than the file: not whole
    assert t.rec[f.ino] == 0 and f.extent_list() == [(0, 4096, 3, 1 << 30, 0, 4096)]
    f.size = 4096  # now it is
    assert f.ino not in t.extents and t.rec[f.ino] and f.extent_list() == [(0, 4096, 3, 1 << 30, 0, 4096)]
    assert f.row()[12] == pack_extents([(0, 4096, 3, 1 << 30, 0, 4096)])
    f.size = 10000  # a hole after the record
    assert t.rec[f.ino] == 0 and f.extent_list() == [(0, 4096, 3, 1 << 30, 0, 4096)]
    assert f.row()[12] == pack_extents([(0, 4096, 3, 1 << 30, 0, 4096)]) and f.row()[5] == 10000
    f.size = 4096
    assert t.rec[f.ino] and f.ino not in t.extents
    f.size = 4196
    ns.map_extent(f, (4096, 100, 3, (1 << 30) + 8192, 0, 100))  # a second record: a dict entry
    assert t.rec[f.ino] == 0 and f.extent_list() == [(0, 4096, 3, 1 << 30, 0, 4096),
                                                     (4096, 100, 3, (1 << 30) + 8192, 0, 100)]
    ns.truncate_extents(f, 4096)
    f.size = 4096
    assert t.rec[f.ino] and f.ino not in t.extents  # one whole record again
    ns.truncate_extents(f, 100)  # part of a record: not whole, so a dict entry
    f.size = 100
    assert t.rec[f.ino] == 0 and f.extent_list() == [(0, 100, 3, 1 << 30, 0, 4096)]
    g = ns.create(ROOT, b"g", REG, 0, 0)
    for i in range(20):  # a long map is a list, edited in place
        ns.map_extent(g, (i * 10, 10, 1, i * 4096, 0, 10))
    assert isinstance(t.extents[g.ino], list) and len(g.extent_list()) == 20
    ns.unlink(ROOT, b"f")
    assert ns.release(f) and t.rec[f.ino] == 0 and f.ino not in t.extents


def test_usage_by_columns_matches_a_walk_of_every_inode():
    """What `packfs stats` counts, from whole columns, equals counting inode by inode."""
    ns = build()  # files with one whole record, split (shared) records, links, a symlink, a fifo
    for n in range(3):
        f = ns.create(ROOT, b"one%d" % n, REG, 0, 0)
        ns.map_extent(f, (0, 5000 + n, 3, n * 16384, 0, 5000 + n))
        f.size = 5000 + n
    ns.release(ns.unlink(ROOT, b"one1"))
    nodes = list(ns)
    dirs = sum(1 for n in nodes if n.is_dir)
    sizes = sum(n.size for n in nodes if not n.is_dir)
    live = {(e[2], e[3], e[5]) for n in nodes for e in n.extent_list()}
    assert ns.table.usage() == (dirs, len(nodes) - dirs, sizes)
    lengths = [*ns.table.record_lengths(), *ns.table.mapped_record_lengths()]
    assert sorted(lengths) == sorted(k[2] for k in live)
    assert sum(map(records.footprint, lengths)) == sum(records.footprint(k[2]) for k in live)
    slots = len(ns.table.kind)
    for step in (1, 2, 3, slots):  # by ranges, as `packfs stats` counts: the same sums
        parts = [ns.table.usage(a, a + step) for a in range(0, slots, step)]
        assert tuple(map(sum, zip(*parts))) == ns.table.usage()
        assert sorted(n for a in range(0, slots, step) for n in ns.table.record_lengths(a, a + step)) == \
            sorted(ns.table.record_lengths())
    assert ns.table.rec[ns.lookup(ROOT, b"one0").ino]  # the column form is exercised


def test_nameless_finds_live_inodes_without_links_only(ns):
    kept = ns.create(ROOT, b"kept", REG, 0, 0)
    gone = ns.create(ROOT, b"gone", REG, 0, 0)
    held = ns.create(ROOT, b"held", REG, 0, 0)
    ns.release(ns.unlink(ROOT, b"gone"))  # freed: a free slot's kind has nlink 0, but it is not live
    held.opens = 1
    ns.unlink(ROOT, b"held")  # open, so not released: live with no name
    assert not ns.table.exists(gone.ino) and ns.table.links[ns.table.kind[gone.ino]] == 0
    assert ns.table.nameless() == [held.ino]
    assert kept.ino not in ns.table.nameless()
    assert ns.table.nameless(held.ino, held.ino + 1) == [held.ino] and ns.table.nameless(0, held.ino) == []


def test_a_whole_record_goes_in_the_column_only_when_it_is_as_long_as_its_file():
    """Rows from the catalog or a replay, by both ways of loading: a record followed by
    a hole (a truncate past its end) keeps its map in `extents`, and every row comes back."""
    rows = [(ROOT, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT),
            (2, REG, 0, 0, 1, 4096, 1, 1, 1, 0, None, None, pack_extents([(0, 4096, 1, 8192, 0, 4096)]), 0),
            (3, REG, 0, 0, 1, 10_000, 1, 1, 1, 0, None, None, pack_extents([(0, 4096, 1, 16384, 0, 4096)]), 0)]
    one, bulk = InodeTable(), InodeTable()
    for row in rows:
        one.load(row)
    bulk.load_all(iter(rows), 4)
    for t in (one, bulk):
        assert [t.row(r[0]) for r in rows] == rows
        assert t.rec[2] and not t.rec[3] and list(t.extents) == [3]
        assert sorted([*t.record_lengths(), *t.mapped_record_lengths()]) == [4096, 4096]
    one.load(rows[2][:5] + (4096,) + rows[2][6:])  # replayed: truncated back to the record's end
    assert one.rec[3] and 3 not in one.extents and one.extent_list(3) == [(0, 4096, 1, 16384, 0, 4096)]


def test_a_number_reused_for_another_type_starts_clean(ns):
    """`kid` and `kname` are a directory's entry or a file's record: a slot that changes
    type must not read one as the other, nor free a record as a name."""
    t = ns.table
    ns.create(ROOT, b"a" * 130, REG, 0, 0)
    ns.create(ROOT, b"b" * 130, REG, 0, 0)  # too long for one arena string: the root's names are packed
    f = ns.create(ROOT, b"f", REG, 0, 0)
    f.size = 4096
    ns.map_extent(f, (0, 4096, 3, 1 << 30, 0, 4096))
    assert t.rec[f.ino] and f.children() == [] and f.extent_list()
    used, free = t.names.used, t.names.free_lists()
    ns.release(ns.unlink(ROOT, b"f"))
    assert (t.names.used, t.names.free_lists()) == (used, free)  # the record was not released as a name
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    assert d.ino == f.ino and d.children() == [] and not d.has_children() and d.extent_list() == []
    ns.create(d.ino, b"x", REG, 0, 0)
    assert [n for n, _ in d.children()] == [b"x"]
    # A replay loading a file's row over a directory's slot, then a directory's over a file's.
    g = ns.create(ROOT, b"g", REG, 0, 0)
    g.size = 4096
    ns.map_extent(g, (0, 4096, 3, 1 << 31, 0, 4096))
    t.load((d.ino, REG, 0, 0, 1, 4096, 1, 1, 1, 0, None, None, pack_extents([(0, 4096, 3, 1 << 32, 0, 4096)]), 0))
    assert Inode(t, d.ino).children() == [] and Inode(t, d.ino).extent_list() == [(0, 4096, 3, 1 << 32, 0, 4096)]
    assert t.names.used == used  # the directory's one name, b"x", was freed
    t.load((g.ino, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT))
    assert Inode(t, g.ino).children() == [] and Inode(t, g.ino).extent_list() == []
    assert sorted([*t.record_lengths(), *t.mapped_record_lengths()]) == [4096]  # d's record; g is a directory now


def test_a_directory_growing_through_every_link_count_keeps_few_kinds(ns):
    """A Swift partition directory gains its suffix directories one at a time and takes
    a kind for each link count below NLINK_TOP: two owners' directories growing so, with
    the files, stay in a u8 column (at a top of 255 they took more than 256 kinds)."""
    t = ns.table
    for owner in (0, 1000):
        d = ns.create(ROOT, b"p%d" % owner, DIR, owner, owner)
        for i in range(300):
            ns.create(ns.create(d.ino, b"%03x" % i, DIR, owner, owner).ino, b"f", REG, owner, owner)
        assert d.nlink == 302 and t.wide_nlink[d.ino] == 302 and t.stat(d.ino)[1] == 302
    assert len(t.kinds) < 2 * inodes.NLINK_TOP + 8 and t.kind.typecode == "B"


def test_kinds_are_numbered_and_the_column_widens_past_u8_and_u16(ns):
    """`kind` numbers (mode, uid, gid, nlink): inodes of one kind share a number, a chmod,
    a chown or a link of one gives it another, and the column is u8, then u16 past 256
    kinds, then u32 past KINDS_NARROW."""
    t = ns.table
    f = ns.create(ROOT, b"f", REG, 1000, 1001)
    g = ns.create(ROOT, b"g", REG, 1000, 1001)
    d = ns.create(ROOT, b"d", DIR, 1000, 1001)
    assert (f.uid, f.gid) == (1000, 1001) and t.kind[f.ino] == t.kind[g.ino] != t.kind[d.ino]
    f.gid = 7
    assert (f.uid, f.gid, g.gid) == (1000, 7, 1001) and t.stat(f.ino)[2:4] == (1000, 7)
    g.mode = stat.S_IFREG | 0o600
    assert (g.mode, g.uid, g.gid, t.stat(g.ino)[0]) == (stat.S_IFREG | 0o600, 1000, 1001, stat.S_IFREG | 0o600)
    assert t.kind.typecode == "B" and d.is_dir and not d.is_reg and g.is_reg
    ns.link(g.ino, ROOT, b"g2")
    assert (g.nlink, t.stat(g.ino)[1], t.row(g.ino)[4]) == (2, 2, 2) and t.kind[f.ino] != t.kind[g.ino]
    assert t.kinds[t.kind[g.ino]] == (stat.S_IFREG | 0o600, 1000, 1001, 2)
    ns.create(d.ino, b"sub", DIR, 1000, 1001)
    assert d.nlink == 3 and t.kinds[t.kind[d.ino]] == (DIR, 1000, 1001, 3)
    for uid in range(300):
        t.kind_of(REG, uid, 98, 1)
    assert t.kind.typecode == "H" and len(t.kind) == len(t.size)
    e = ns.create(ROOT, b"e", REG, 299, 98)
    assert t.kind[e.ino] > 255 and (e.uid, e.gid, f.gid, g.uid) == (299, 98, 7, 1000)
    assert t.of_type(stat.S_IFDIR)[d.ino] == 1 and t.of_type(stat.S_IFREG)[e.ino] == 1 == t.of_type(stat.S_IFREG)[f.ino]
    for uid in range(KINDS_NARROW):
        t.kind_of(REG, uid, 99, 1)
    assert t.kind.typecode == "I" and len(t.kind) == len(t.size)
    h = ns.create(ROOT, b"h", REG, KINDS_NARROW - 1, 99)
    assert t.kind[h.ino] >= KINDS_NARROW and (h.uid, h.gid, f.gid) == (KINDS_NARROW - 1, 99, 7)
    assert t.row(h.ino)[1:4] == (REG, KINDS_NARROW - 1, 99) and (e.uid, e.gid) == (299, 98)
    assert [*t.usage()[:2]] == [3, 4] and d.is_dir and t.of_type(stat.S_IFDIR)[d.ino] == 1


def test_loaded_entries_take_their_final_form_at_once():
    """The catalog gives entries by parent: each directory's are placed once (no string of
    every size on the way left in the arena); entries out of order still all arrive."""
    import random

    from packfs.namespace.dirents import PackedEntries
    from packfs.namespace.inodes import SMALL
    dirents = [(2, b"only", 10)] + [(3, b"%032x" % i, 20 + i) for i in range(3)] + \
              [(4, b"%03x" % i, 100 + i) for i in range(40)]
    for order in ("catalog", "shuffled"):
        t = InodeTable()
        for d in (2, 3, 4):
            t.put(d, DIR, 0, 0, 1)
        rows = sorted(dirents) if order == "catalog" else random.Random(7).sample(dirents, len(dirents))
        t.load_entries(rows)
        assert (t.kid[2], t.kid[3], t.kid[4]) == (10, SMALL, 0) and type(t.dirs[4]) is PackedEntries
        for d in (2, 3, 4):
            assert sorted(t.children(d)) == sorted((n, i) for p, n, i in dirents if p == d)
        if order == "catalog":
            assert t.names.wasted() == 0


def test_plain_blobs_wait_outside_the_arena_until_compressed(ns):
    """setxattr's plain blobs (Swift's ~440 B) are held beside the arena until the
    compressor stores them small in it, so their short lives leave no free runs there;
    they read back, go with their inode, and a checkpoint without xattrs_in_memory hands
    them to the catalog like any other value."""
    t = ns.table
    f = ns.create(ROOT, b"f", REG, 0, 0)
    g = ns.create(ROOT, b"g", REG, 0, 0)
    meta = b"{'X-Timestamp': '1763800000.12345', 'ETag': '%032x'}" * 8
    ns.setxattr(f.ino, b"user.swift.metadata", meta)
    ns.setxattr(g.ino, b"user.swift.metadata", meta)
    assert (t.uncompressed(), t.xblobs.used, t.xattrs_in_memory()) == (2, RESERVED_REFS * XATTR_GRAIN, 2)
    assert ns.getxattr(f.ino, b"user.swift.metadata") == meta and not is_compressed(f.row()[11])
    ns.release(ns.unlink(ROOT, b"g"))
    assert t.uncompressed() == 1 and t.packed_xattrs(g.ino) is None
    t.compress_xattrs()
    assert (t.uncompressed(), t.xattrs_in_memory()) == (0, 1) and is_compressed(f.row()[11])
    assert t.xblobs.used > RESERVED_REFS * XATTR_GRAIN and ns.getxattr(f.ino, b"user.swift.metadata") == meta
    t.keep_xattrs = False
    ns.setxattr(f.ino, b"user.b", b"b" * 200)
    t.checkpointed([t.row(f.ino)])
    assert (t.uncompressed(), t.xref(f.ino), t.xattrs_in_memory()) == (0, IN_CATALOG, 0)


def test_a_slot_is_30_bytes():
    """What `packfs stats` reports as the inode columns: 30 B per slot, free and headroom too;
    34 and 38 B once `atime` and `ctime` hold whole times, 42 B once `kid` is i64 too (an
    xattr reference past u32), 46 once `kname` is; and the far times beside the time columns."""
    t = InodeTable()
    t.grow(5000)
    assert len(t.kind) >= 5000 and t.column_bytes() == 30 * len(t.kind)
    Inode(t, 7).set_times(10**18, 0, 10**18)  # both far from mtime
    assert t.column_bytes() == 30 * len(t.kind) + 2 * 8
    t.atimes._go_whole()
    assert t.column_bytes() == 34 * len(t.kind) + 8
    t.ctimes._go_whole()
    assert t.column_bytes() == 38 * len(t.kind)
    t._wide_kid()
    assert t.column_bytes() == 42 * len(t.kind)
    t.set_kname(9, 1 << 32)
    assert t.column_bytes() == 46 * len(t.kind) and t.kname[9] == 1 << 32


def test_whole_records_index_their_volumes_and_reuse_the_indexes_of_dead_ones(ns, monkeypatch):
    """A whole record is `volume index << 20 | offset / 4 KiB` in the u32 `kname`. A
    record that starts past its volume's first 4 GiB keeps its map in `extents`. When the
    indexes run out, those of volumes no record uses are given back; if more volumes than
    that hold records, the column becomes i64. Every record and name reads back."""
    t = ns.table
    d = ns.create(ROOT, b"d", DIR, 0, 0)
    ns.create(d.ino, b"only", REG, 0, 0)
    deep = ns.create(ROOT, b"deep", REG, 0, 0)
    deep.size = 4096
    ns.map_extent(deep, (0, 4096, 3, 1 << 32, 0, 4096))
    assert not t.rec[deep.ino] and deep.extent_list() == [(0, 4096, 3, 1 << 32, 0, 4096)]
    monkeypatch.setattr(inodes, "VOLUME_INDEXES", 8)  # renumber after 7 volumes, not 4,095
    t.renumber_at = 8
    files = []
    for vol in range(1, 21):  # one file a volume; all but the last three of these go
        f = ns.create(ROOT, b"f%d" % vol, REG, 0, 0)
        f.size = 8192
        ns.map_extent(f, (0, 8192, (1 << 31) + vol, (vol - 1) << 12, 0, 8192))
        files.append(f)
        if vol <= 17:
            ns.release(ns.unlink(ROOT, b"f%d" % vol))
    assert len(t.volumes) < 8 and t.kname.typecode == "I"
    assert [f.extent_list() for f in files[17:]] == [[(0, 8192, (1 << 31) + vol, (vol - 1) << 12, 0, 8192)]
                                                      for vol in (18, 19, 20)]
    many = [ns.create(ROOT, b"m%d" % vol, REG, 0, 0) for vol in range((1 << 32 >> 20) + 2)]
    for vol, f in enumerate(many):
        f.size = 4096
        ns.map_extent(f, (0, 4096, vol + 100, 4096, 0, 4096))
    assert t.kname.typecode == "q" and not t.extents.keys() - {deep.ino}
    assert all(f.extent_list() == [(0, 4096, vol + 100, 4096, 0, 4096)] for vol, f in enumerate(many))
    assert [f.extent_list()[0][2] for f in files[17:]] == [(1 << 31) + vol for vol in (18, 19, 20)]
    assert [n for n, _ in d.children()] == [b"only"] and ns.lookup(d.ino, b"only")


def test_a_directory_keeps_its_parent_where_a_file_keeps_its_size():
    """One column holds a directory's parent and anything else's size: a directory's size
    is 0 and a file has no parent, through every way in and out of a slot, and a number
    reused for the other type (a 5 GiB file's, kept beside the column) says nothing of the
    old value."""
    big = 5 << 30
    t = InodeTable()
    t.put(ROOT, DIR, 0, 0, 1)
    Inode(t, ROOT).parent = ROOT
    t.load((2, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, ROOT))
    t.load_all([(3, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, 2),
                (4, REG, 0, 0, 1, 4095, 1, 1, 1, 0, None, None, None, 0),
                (5, REG, 0, 0, 1, big, 1, 1, 1, 0, None, None, None, 0)], 6)
    d, f = Inode(t, 3), Inode(t, 4)
    assert (d.parent, d.size, f.parent, f.size, Inode(t, 5).size) == (2, 0, 0, 4095, big)
    assert t.stat(3)[5] == 0 and t.stat(4)[5] == 4095 and t.stat(5)[5] == big
    assert [t.row(i)[5::8] for i in (2, 3, 4, 5)] == [(0, ROOT), (0, 2), (4095, 0), (big, 0)]
    assert t.usage() == (3, 2, 4095 + big)
    d.parent = ROOT  # a rename to another directory
    f.size = 10
    assert (d.parent, d.size, f.size) == (ROOT, 0, 10)
    t.load((5, DIR, 0, 0, 2, 0, 1, 1, 1, 0, None, None, None, 3))  # the file's number, now a directory's
    t.load((3, REG, 0, 0, 1, 7, 1, 1, 1, 0, None, None, None, 0))  # and the other way
    assert (Inode(t, 5).parent, Inode(t, 5).size, t.wide_size) == (3, 0, {})
    assert (Inode(t, 3).parent, Inode(t, 3).size) == (0, 7)
    with pytest.raises(AssertionError):
        Inode(t, 4).parent = 2
    with pytest.raises(AssertionError):
        Inode(t, 5).size = 1


def test_values_past_a_narrow_columns_top_are_kept_whole():
    """A 5 GiB file, directories with 70,000 and 62 subdirectories (a kind's nlink stops
    at NLINK_TOP), an inode the kernel holds 70,000 references to (its column widens):
    the narrow columns and the kinds hold their top and the values live beside them,
    through every way in and out of a slot; a freed or reused slot forgets them."""
    from packfs.namespace import image
    big, links, top = 5 << 30, 70_002, inodes.NLINK_TOP
    t = InodeTable()
    t.put(ROOT, DIR, 0, 0, 1)
    t.load((2, REG, 0, 0, 1, big, 1, 1, 1, 0, None, None, None, ROOT))
    t.load_all([(3, DIR, 0, 0, links, 0, 1, 1, 1, 0, None, None, None, ROOT),
                (4, REG, 0, 0, 1, 4095, 1, 1, 1, 0, None, None, None, ROOT),
                (5, DIR, 0, 0, top, 0, 1, 1, 1, 0, None, None, None, ROOT),  # a partition directory's
                (6, DIR, 0, 0, top - 1, 0, 1, 1, 1, 0, None, None, None, ROOT)], 7)
    assert t.wide_nlink == {3: links, 5: top} and Inode(t, 5).nlink == top and t.links[t.kind[6]] == top - 1
    Inode(t, 6).nlink += 1
    Inode(t, 5).nlink -= 1
    assert t.wide_nlink == {3: links, 6: top} and t.links[t.kind[5]] == top - 1 == Inode(t, 5).nlink
    t.drop(5)
    t.drop(6)
    assert t.wide_nlink == {3: links}
    f, d = Inode(t, 2), Inode(t, 3)
    f.lookups = 70_000
    assert (f.size, d.nlink, f.lookups) == (big, links, 70_000)
    assert t.stat(2)[5] == big and t.stat(3)[1] == links and t.row(2)[5] == big and t.row(3)[4] == links
    assert t.usage() == (2, 2, big + 4095)
    assert t.usage(0, 2) == (1, 0, 0) and t.usage(2, 3) == (0, 1, big) and t.usage(3) == (1, 1, 4095)
    f.size, f.lookups = big + 1, 3
    assert (f.size, f.lookups) == (big + 1, 3)
    token = 7
    with tempfile.TemporaryDirectory() as tmp:
        image.save(tmp, t, token, (1, 0, 0, 5))
        back = image.take(tmp, token, (1, 0, 0, 5), True)
    assert back is not None and Inode(back, 2).size == big + 1 and Inode(back, 3).nlink == links
    t.drop(2)
    t.put(2, REG, 0, 0, 1)
    assert f.size == 0 and t.wide_size == {} and t.size[2] == 0


def test_atime_and_ctime_are_distances_from_mtime_and_far_ones_are_kept_whole():
    """atime is a u32 distance before mtime and ctime one after it; a time too far from
    mtime (a directory that gains an entry minutes after its making, utime, a chown of an
    old tree) is kept whole beside its column, exactly, until it is near again, and its
    entry there is reused."""
    t = InodeTable()
    now = 1_700_000_000_123_456_789
    t.put(5, REG, 0, 0, now)
    node = Inode(t, 5)
    node.modified(now + 3_000_000)
    assert node.times() == (now, now + 3_000_000, now + 3_000_000)
    assert (t.atime[5], t.ctime[5]) == (3_000_000, 0)
    node.ctime = now + 3_000_005
    assert t.ctime[5] == 5 and node.times() == (now, now + 3_000_000, now + 3_000_005)
    node.modified(now + FAR)  # the atime is now too far before the mtime
    assert node.times() == (now, now + FAR, now + FAR) and t.atime[5] == FAR and t.atimes.far_count() == 1
    node.modified(now + FAR + 7)  # still far: the same entry
    assert node.times() == (now, now + FAR + 7, now + FAR + 7) and len(t.atimes.far) == 1
    far = [(0, 4_102_444_800_000_000_001, now),  # far future mtime, as utime allows
           (now + 1, now, now - 1),  # atime after mtime, ctime before it
           (now - FAR, now, now + FAR)]  # just past what fits
    for times in far:
        node.set_times(*times)
        assert node.times() == t.times(5) == times and t.stat(5)[6:] == times and t.row(5)[6:9] == times
        assert (t.atime[5], t.ctime[5]) == (FAR, FAR)
        assert (t.atimes.far_count(), t.ctimes.far_count()) == (1, 1)
    node.modified(now)  # a write: ctime near again, the atime still far
    assert node.times() == (now - FAR, now, now) and (t.atimes.far_count(), t.ctimes.far_count()) == (1, 0)
    node.set_times(now - FAR + 1, now, now + FAR - 1)  # the farthest that fit
    assert node.times() == (now - FAR + 1, now, now + FAR - 1)
    assert (t.atimes.far_count(), t.ctimes.far_count()) == (0, 0)
    node.set_times(-1, now, -1)  # far again: the entries freed above are reused
    assert (len(t.atimes.far), len(t.ctimes.far)) == (1, 1)
    t.drop(5)
    assert (t.atimes.far_count(), t.ctimes.far_count()) == (0, 0)
    t.put(6, DIR, 0, 0, now)
    Inode(t, 6).set_times(now, 1, now)  # another slot reuses what 5 freed, not a new entry
    assert (len(t.atimes.far), len(t.ctimes.far)) == (1, 1) and t.times(6) == (now, 1, now)
    t.put(5, REG, 0, 0, now)  # the number reused: its slot says nothing of the old times
    assert t.times(5) == (now, now, now) and (t.atime[5], t.ctime[5]) == (0, 0)


@pytest.mark.parametrize("how", ["load", "load_all"])
@pytest.mark.parametrize("which", ["atime", "ctime"])
@pytest.mark.parametrize("touched", [False, True])
def test_a_time_column_with_many_far_times_holds_whole_times(how, which, touched):
    """A utime or chown of an old tree puts times far from their mtimes: once half of a
    column's slots would need a far time the column holds whole times, every time
    unchanged; the other column keeps its distances."""
    n = 8 * 1024  # above the smallest number that turns a column whole
    far = 10**13 if touched else 0
    rows = [(ino, DIR, 0, 0, 2, 0,
             ino - 3 - (far if which == "atime" and ino % 3 else 0), ino,
             ino + 7 + (far if which == "ctime" and ino % 3 else 0),
             0, None, None, None, ROOT) for ino in range(ROOT, ROOT + n)]
    t = InodeTable()
    if how == "load":
        for row in rows:
            t.load(row)
    else:
        t.load_all(iter(rows), ROOT + n)
    other = "ctime" if which == "atime" else "atime"
    assert getattr(t, other).typecode == "I"
    if touched:
        assert getattr(t, which).typecode == "q" and getattr(t, which + "s").far_count() == 0
    else:
        assert getattr(t, which).typecode == "I" and getattr(t, which)[ROOT:ROOT + n] == \
            array("I", [3 if which == "atime" else 7] * n)
    assert [t.row(r[0]) for r in rows] == rows
    Inode(t, ROOT).set_times(1, 2, 3)
    Inode(t, ROOT + 1).modified(9)
    assert t.times(ROOT) == (1, 2, 3) and t.times(ROOT + 1) == (rows[1][6], 9, 9)


@pytest.mark.parametrize("how", ["load_all", "set_xattrs", "compress_xattrs"])
def test_xattr_references_past_u32_make_the_column_i64(monkeypatch, how):
    """`xat` (`kid`) is u32 (references in 8 B grains: 32 GiB of values); a reference past
    that, from any of the three places that store one, makes it i64 and keeps every value."""
    monkeypatch.setattr("packfs.namespace.xattrstore.KID_TOP", 1)  # every reference is past it
    swift = pack_xattrs({b"user.swift.metadata": b"{'ETag': 'x', 'Content-Length': '4096'}" * 8}, compress=False)
    t = InodeTable()
    if how == "load_all":
        t.load_all(iter(sample_rows()), 8)
        expected = {r[0]: r[11] for r in sample_rows() if r[11]}
    else:
        t.put(5, REG, 0, 0, 1)
        t.set_xattrs(5, swift)
        expected = {5: swift}
        if how == "set_xattrs":
            t.put(6, REG, 0, 0, 1)
            t.set_xattrs(6, pack_xattrs({b"user.a": b"b"}))
            expected[6] = pack_xattrs({b"user.a": b"b"})
        else:
            assert t.kid.typecode == "I"
            assert t.compress_xattrs() is False and t.kid[5] > 1
    assert t.kid.typecode == "q"
    assert {ino: t.plain_xattrs(ino) for ino in expected} == {ino: plain(x) for ino, x in expected.items()}


def test_the_table_tells_of_every_xattr_change_and_every_inode_that_goes(ns):
    """The FUSE adapter's copies of xattrs (fuseshim.cache_xattrs) rely on it."""
    told: list[int] = []
    ns.table.xattrs_changed = told.append
    f = ns.create(ROOT, b"f", REG, 0, 0)
    ns.setxattr(f.ino, b"user.a", b"1")
    ns.setxattr(f.ino, b"user.b", b"2")
    ns.removexattr(f.ino, b"user.a")
    assert told == [f.ino] * 3
    assert ns.plain_xattrs(f.ino) == pack_xattrs({b"user.b": b"2"}, compress=False)
    ns.table.compress_xattrs()  # the same values in another form: nothing to tell
    assert told == [f.ino] * 3
    ns.unlink(ROOT, b"f")
    assert ns.release(f)
    assert told == [f.ino] * 4
    assert ns.plain_xattrs(ns.create(ROOT, b"g", REG, 0, 0).ino) == b""


def test_dropped_lookups_name_the_inodes_left_unreferenced_and_nameless(ns):
    """FORGET's bulk path: counts go down (never below 0, in a widened column too), and
    only inodes left with no reference and no name come back; numbers of freed or unknown
    slots are passed over."""
    t = ns.table
    kept, gone, wide = (ns.create(ROOT, n, REG, 0, 0) for n in (b"kept", b"gone", b"wide"))
    kept.lookups, gone.lookups, wide.lookups = 2, 1, 70_000
    ns.unlink(ROOT, b"gone")
    assert t.drop_lookups([(kept.ino, 1), (gone.ino, 5), (wide.ino, 1), (999_999, 1), (0, 1)]) == [gone.ino]
    assert (kept.lookups, gone.lookups, wide.lookups) == (1, 0, 69_999)
    ns.unlink(ROOT, b"wide")
    assert t.drop_lookups([(wide.ino, 69_998)]) == [] and wide.lookups == 1
    assert t.drop_lookups([(wide.ino, 1), (kept.ino, 1)]) == [wide.ino]
    assert (wide.lookups, kept.lookups, t.lookups.typecode) == (0, 0, "I")


def test_the_lookup_column_widens_when_a_count_needs_it():
    """u8 until a count passes 255 (the kernel's references grow at every revalidation of
    an entry: a long-lived directory's pass 255), then u16, then u32; counts are kept."""
    t = InodeTable()
    for ino in (2, 3):
        t.put(ino, DIR, 0, 0, 1)
    a, b = Inode(t, 2), Inode(t, 3)
    a.lookups, b.lookups = 255, 7
    assert t.lookups.typecode == "B" and t.column_bytes() == 30 * len(t.kind)
    a.lookups += 1
    assert (a.lookups, b.lookups, t.lookups.typecode) == (256, 7, "H")
    assert t.column_bytes() == 31 * len(t.kind)
    b.lookups = 1 << 16
    assert (a.lookups, b.lookups, t.lookups.typecode) == (256, 1 << 16, "I")
    t.grow(len(t.kind) + 1)  # grows in its new width
    assert t.lookups.typecode == "I" and len(t.lookups) == len(t.kind)
