"""The SQLite catalog: a checkpoint of a namespace loads back equal, incrementally too."""
from __future__ import annotations

import stat
import sys
import threading

import apsw
import pytest

from packfs.core.catalog import Catalog, CatalogError
from packfs.core.journal import snapshot
from packfs.store.extents import pack as pack_extents, unpack as unpack_extents
from packfs.namespace.xattrblob import pack_xattrs, unpack_xattrs
from packfs.namespace.namespace import ROOT, Namespace
from packfs.core.recovery import load_namespace

REG = stat.S_IFREG | 0o640
DIR = stat.S_IFDIR | 0o750


def dump(ns: Namespace) -> tuple:
    """Everything the catalog must preserve, in a comparable form."""
    inodes = {}
    for node in ns:
        row = list(node.row())
        row[11] = dict(sorted(unpack_xattrs(row[11]).items())) if row[11] else None
        row[12] = unpack_extents(row[12]) if row[12] is not None else None
        inodes[node.ino] = tuple(row)
    entries = {node.ino: dict(sorted(node.children())) for node in ns if node.is_dir}
    return inodes, entries, dict(ns.refs)


def build() -> Namespace:
    ns = Namespace.fresh(0, 0)
    d = ns.create(ROOT, b"objects", DIR, 10, 20)
    sub = ns.create(d.ino, b"sub", DIR, 10, 20)
    f = ns.create(sub.ino, b"1.data", REG, 30, 40)
    ns.map_extent(f, (0, 1 << 20, 1, 0, 0, 1 << 20))
    ns.map_extent(f, (1 << 20, 123, 1, (1 << 20) + 4096, 0, 123))
    ns.map_extent(f, (4096, 100, 2, 8192, 0, 100))  # splits the first record: shared refs
    f.size = (1 << 20) + 123
    f.atime, f.mtime, f.ctime = 1, 1_600_000_000_123_456_789, 3
    ns.setxattr(f.ino, b"user.swift.metadata", bytes(range(256)) * 256)
    ns.setxattr(f.ino, b"user.swift.metadata1", b"")
    ns.link(f.ino, ROOT, b"hardlink")
    ns.create(ROOT, b"symlink", stat.S_IFLNK | 0o777, 0, 0, target=b"objects/sub/1.data")
    ns.create(ROOT, b"fifo", stat.S_IFIFO | 0o600, 0, 0)
    ns.create(ROOT, b"\xff\xfe binary name", REG, 0, 0)
    ns.setxattr(d.ino, b"user.dir", b"v")
    return ns


def checkpoint(cat: Catalog, ns: Namespace, **settings) -> None:
    """As the journal's checkpoint does: xattrs compressed, then the changes written."""
    ns.table.compress_xattrs()
    ns.take_journal_changes()
    rows, removed, dirents, refs = snapshot(ns, ns.take_catalog_changes().changes())
    cat.checkpoint(rows, removed, dirents, refs, {"next_ino": ns.next_ino, **settings})


@pytest.fixture
def cat(tmp_path):
    c = Catalog(str(tmp_path / "catalog.sqlite"), create=True)
    c.initialise(0xABCDEF)
    yield c
    c.close()


def test_round_trip(tmp_path, cat):
    ns = build()
    checkpoint(cat, ns, volume=1, offset=8192, seq=17)
    cat.close()
    reopened = Catalog(str(tmp_path / "catalog.sqlite"))
    try:
        loaded = load_namespace(reopened)
        assert dump(loaded) == dump(ns)
        assert dump(load_namespace(reopened, xattrs_in_memory=False)) == dump(ns)
        assert loaded.next_ino == ns.next_ino
        assert loaded.refs == {(1, 0, 1 << 20): 2}
        assert (reopened.settings["volume"], reopened.settings["offset"], reopened.settings["seq"]) == (1, 8192, 17)
        assert reopened.settings["pack_id"] == 0xABCDEF
        assert reopened.counts() == (len(ns), sum(len(n.children()) for n in ns if n.is_dir))
    finally:
        reopened.close()


def test_incremental_checkpoints(tmp_path, cat):
    ns = build()
    checkpoint(cat, ns)
    # Unlink, rename, rmdir, release, xattr removal, truncation: only the changes go in.
    obj = ns.lookup(ROOT, b"objects")
    sub = ns.lookup(obj.ino, b"sub")
    f = ns.lookup(sub.ino, b"1.data")
    ns.unlink(ROOT, b"hardlink")
    ns.rename(sub.ino, b"1.data", ROOT, b"moved.data")
    ns.rmdir(obj.ino, b"sub")
    ns.release(sub)
    ns.removexattr(f.ino, b"user.swift.metadata1")
    ns.truncate_extents(f, 4000)
    f.size = 4000
    gone = ns.lookup(ROOT, b"fifo")
    ns.unlink(ROOT, b"fifo")
    ns.release(gone)
    checkpoint(cat, ns)
    loaded = load_namespace(cat)
    assert dump(loaded) == dump(ns)
    assert gone.ino not in loaded and sub.ino not in loaded
    assert loaded.refs == {}


def test_empty_checkpoint_changes_nothing(cat):
    ns = build()
    checkpoint(cat, ns)
    before = dump(load_namespace(cat))
    checkpoint(cat, ns)
    assert dump(load_namespace(cat)) == before


def test_missing_or_foreign_catalog(tmp_path):
    with pytest.raises(CatalogError):
        Catalog(str(tmp_path / "nothing.sqlite"))
    c = Catalog(str(tmp_path / "other.sqlite"), create=True)  # never initialised: no format
    c.close()
    with pytest.raises(CatalogError, match="format"):
        Catalog(str(tmp_path / "other.sqlite"))
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CatalogError):
        Catalog(str(tmp_path / "junk.sqlite"))


def test_blob_codecs():
    exts = [(0, 10, 1, 0, 0, 10), (1 << 40, 1 << 31, 1 << 31, 1 << 50, 5, (1 << 32) - 1)]
    assert unpack_extents(pack_extents(exts)) == exts
    assert unpack_extents(pack_extents([])) == []
    assert pack_extents(None) is None and unpack_extents(None) is None
    x = {b"user.a": b"", b"user.b" * 40: b"\x00" * 65536}
    assert unpack_xattrs(pack_xattrs(x)) == x
    assert pack_xattrs({}) is None and unpack_xattrs(None) is None


def test_xattrs_are_read_from_the_last_checkpoint_while_the_next_is_being_written(cat):
    ns = build()
    checkpoint(cat, ns)
    f = ns.lookup(ROOT, b"hardlink")
    old = cat.xattrs_of(f.ino)
    assert unpack_xattrs(old)[b"user.swift.metadata1"] == b"" and cat.xattrs_of(999) is None
    ns.setxattr(f.ino, b"user.swift.metadata1", b"newer")
    ns.take_journal_changes()
    rows, removed, dirents, refs = snapshot(ns, ns.take_catalog_changes().changes())
    assert [r[0] for r in rows] == [f.ino]
    with cat.db:  # the next checkpoint's transaction, not committed yet
        cat.db.executemany("INSERT OR REPLACE INTO inodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        assert cat.xattrs_of(f.ino) == old  # neither blocked nor shown the uncommitted row
    assert unpack_xattrs(cat.xattrs_of(f.ino))[b"user.swift.metadata1"] == b"newer"


def test_a_new_reader_opens_while_a_checkpoint_holds_the_first_connection(cat):
    """The pool of readers grows while a checkpoint may be running on the first connection
    in a worker thread; opening the new reader must not touch that connection (apsw
    refuses any use of a connection busy in another thread: getxattr failed with EIO)."""
    ns = build()
    checkpoint(cat, ns)
    f = ns.lookup(ROOT, b"hardlink")
    inside, release = threading.Event(), threading.Event()

    def hold(x: int) -> int:
        inside.set()
        assert release.wait(10)
        return x

    cat.db.create_scalar_function("hold", hold, 1)
    busy = threading.Thread(target=lambda: cat.db.execute("SELECT hold(1)").fetchall())
    busy.start()
    try:
        assert inside.wait(10)
        assert not cat._readers  # so the read opens a connection of its own
        assert unpack_xattrs(cat.xattrs_of(f.ino))[b"user.swift.metadata1"] == b""
    finally:
        release.set()
        busy.join(10)


def test_a_checkpoints_commit_lets_other_threads_run(cat):
    """The commit's writes and fsyncs run without the GIL, so the event loop's thread
    serves requests meanwhile; apsw's `with connection` committed holding it (80 ms stalls).

    With forced GIL switches off, the main thread can run between SQLite's commit hook
    (before the commit writes the WAL) and its WAL hook (after the WAL's fsync) only if
    the committing thread let the GIL go for that I/O. The transaction is made big, and
    its pages kept in memory until the commit, so the I/O outlasts a thread's wake-up."""
    xattrs = pack_xattrs({b"user.swift.metadata": bytes(range(256)) * 2})
    rows = [(ino, REG, 0, 0, 1, 0, 0, 0, 0, 0, None, xattrs, None, ROOT) for ino in range(2, 40_002)]
    cat.db.execute("PRAGMA cache_size=-200000").fetchall()
    committing, seen = threading.Event(), {}

    def on_commit() -> bool:
        committing.set()
        return False  # go on committing

    def on_wal(db, name, pages) -> int:
        seen["ran"] = "main" in seen  # read at once, without letting go of the GIL
        return apsw.SQLITE_OK

    cat.db.set_commit_hook(on_commit)
    cat.db.set_wal_hook(on_wal)
    worker = threading.Thread(target=cat.checkpoint, args=(rows, [], [], [], {"next_ino": 40_002}))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        worker.start()
        assert committing.wait(60)
        seen["main"] = True
        worker.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not worker.is_alive() and cat.top_ino() == 40_001
    assert seen["ran"], "the commit held the GIL through its I/O"


def test_a_failed_checkpoint_changes_nothing_and_the_next_one_commits(cat):
    ns = build()
    checkpoint(cat, ns)
    before = cat.counts(), cat.stamp, dict(cat.db.execute("SELECT key, value FROM settings"))
    good = (90, REG, 0, 0, 1, 0, 0, 0, 0, 0, None, None, None, ROOT)
    with pytest.raises(apsw.BindingsError):  # a row one column short, after a good one
        cat.checkpoint([good, good[:-1]], [], [], [], {"next_ino": 91, "seq": 99})
    cat.db.set_commit_hook(lambda: True)  # the COMMIT itself fails: SQLite rolls back
    with pytest.raises(apsw.ConstraintError):
        cat.checkpoint([good], [], [], [], {"next_ino": 91, "seq": 99})
    cat.db.set_commit_hook(None)
    assert (cat.counts(), cat.stamp, dict(cat.db.execute("SELECT key, value FROM settings"))) == before
    assert cat.db.get_autocommit()
    cat.checkpoint([good], [], [], [], {"next_ino": 91})
    assert cat.top_ino() == 90 and cat.stamp[3] == 91
