"""The fuse shim's LOOKUP, GETATTR, listings and READs answered in C from the inode table
(_shimmeta.c) against Operations' own answers, for a table with every kind of inode, listing
form, xattrs and record; and the layout header C is built with against the namespace's constants."""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import stat
import struct
import time
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyfuse3
import pytest
import trio
from started import with_filesystem

from packfs.core.filesystem import Filesystem, Setattr
from packfs.errors import FsError
from packfs.core.writeback import Buffer
from packfs.fuse import fuseshim, tablelayout
from packfs.fuse.ops import Operations
from packfs.namespace.dirents import PackedEntries
from packfs.namespace.xattrblob import SWIFT_FORM_PREFIX, is_compressed, iter_xattrs
from packfs.namespace.xattrstore import IN_CATALOG, IN_RECORD
from packfs.namespace.inodes import NLINK_TOP, ROOT, InodeTable

pytestmark = pytest.mark.skipif(not fuseshim.loaded(), reason="the fuse shim library is not built")

CTX = pyfuse3.RequestContext()


def test_layout_header_is_current() -> None:
    assert tablelayout.HEADER.read_text() == tablelayout.header(), \
        "run `python -m packfs.fuse.tablelayout` and rebuild the fuse shim"


def test_named_attributes_are_what_c_reads() -> None:
    t = InodeTable()
    for name in tablelayout.COLUMNS.values():
        assert isinstance(memoryview(getattr(t, name)), memoryview)
    for name in tablelayout.DICTS.values():
        assert type(getattr(t, name)) is dict
    assert type(t.kinds) is list and type(t.names.data) is bytearray and type(t.names.grain) is int
    for times in (t.atimes, t.ctimes):
        memoryview(times.column), memoryview(times.far)
    assert isinstance(Buffer.size, types.MemberDescriptorType)  # an unflushed run's size: a slot
    assert type(t.xblobs.data) is bytearray and type(t.xblobs.grain) is int and t._xnew is None
    packed = PackedEntries([(b"a", 2)])
    assert type(packed.names) is bytearray and packed.inos.typecode == "I" and type(packed.width) is int
    for obj, names in ((InodeTable, [*tablelayout.COLUMNS.values(), *tablelayout.DICTS.values(), "kinds", "names",
                                     "atimes", "ctimes", "xblobs", "_xnew"]),
                       (PackedEntries, ["names", "inos", "width"])):
        for name in names:  # a property would run Python code where C reads it
            assert not isinstance(getattr(obj, name, None), property), name


@contextmanager
def _serving(table: object, volumes: object, entry_timeout: float, attr_timeout: float, getattr_too: bool,
             atime: str) -> Iterator[None]:
    """The shim answers from this table in the block, and from none after it."""
    fuseshim.serve_metadata(table, volumes, entry_timeout, attr_timeout, getattr_too, atime)
    try:
        yield
    finally:
        fuseshim.serve_metadata(None, None, 0, 0, False, "noatime")


def _python(a: pyfuse3.EntryAttributes, entry: bool) -> tuple[int, ...]:
    return (a.st_ino, a.st_mode, a.st_nlink, a.st_uid, a.st_gid, a.st_rdev, a.st_size, a.st_blksize, a.st_blocks,
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns, round(a.entry_timeout * 1000) if entry else 0,
            round(a.attr_timeout * 1000))


async def _write(fs: Filesystem, ino: int, offset: int, data: bytes, flush: bool = True) -> None:
    """Write and commit; or (not flush) write and keep the file open, its run unflushed."""
    fh = fs.open(ino)
    await fs.write(fh, offset, data)
    if flush:
        await fs.fsync(fh=fh)
        await fs.release(fh)


async def _tree(fs: Filesystem) -> None:
    """Every kind of inode and listing form under ROOT."""
    mk = fs.create
    d = mk(ROOT, b"dir", 0o40755, 0, 0).ino
    mk(ROOT, b"empty", 0o40700, 1000, 1000)
    one = mk(d, b"0123456789abcdef0123456789abcdef", 0o40755, 0, 0).ino  # a hash directory's one name
    data = mk(one, b"1700000000.12345.data", 0o100644, 0, 0).ino
    await _write(fs, data, 0, b"x" * 4096)
    fs.setxattr(data, b"user.swift.metadata", b"m" * 300)
    mk(d, b"1700000000.00001.meta", 0o100600, 5, 6)  # another name beside it: a small listing
    mk(d, b"plain", 0o100644, 0, 0)  # empty
    suffix = mk(ROOT, b"abc", 0o40755, 0, 0).ino
    mk(suffix, b"00ff" * 8, 0o40755, 0, 0)  # one hex name, kept as its bytes
    mk(mk(ROOT, b"lone", 0o40755, 0, 0).ino, b"only", 0o100644, 0, 0)  # one name, kept as it is
    holes = mk(ROOT, b"holes", 0o100644, 0, 0).ino
    await _write(fs, holes, 1 << 20, b"y" * 5000)  # a map with a hole: extents
    huge = mk(ROOT, b"huge", 0o100644, 0, 0).ino
    await fs.setattr(huge, Setattr(size=5 << 30))  # past the size column's top
    await fs.setattr(huge, Setattr(atime=10**9, mtime=2 * 10**18))  # times far apart
    over = mk(ROOT, b"over", 0o100644, 0, 0).ino  # a run beside a map
    await _write(fs, over, 0, b"o" * 8192)  # (a commit: before any run that must stay unflushed)
    await _write(fs, over, 8192, b"p" * 10, flush=False)
    unflushed = mk(ROOT, b"unflushed", 0o100644, 0, 0).ino  # a run over no map
    await _write(fs, unflushed, 0, b"z" * 100, flush=False)
    assert fs.ns.table.wbuf[unflushed].size and fs.ns.table.wbuf[over].size
    fs.link(data, ROOT, b"hardlink")
    mk(ROOT, b"symlink", 0o120777, 0, 0, target=b"dir/plain")
    mk(ROOT, b"fifo", 0o10644, 0, 0)
    mk(ROOT, b"socket", 0o140644, 0, 0)
    mk(ROOT, b"chr", 0o20644, 0, 0, rdev=0x0103)
    packed = mk(ROOT, b"packed", 0o40755, 0, 0).ino  # PackedEntries (a Swift partition directory's suffixes)
    for i in range(200):
        mk(packed, b"%03x" % i, 0o40755, 0, 0)
    varied = mk(ROOT, b"varied", 0o40755, 0, 0).ino  # PackedEntries of names of several lengths
    for i in range(80):
        mk(varied, b"n" * (1 + i % 7) + b"%d" % i, 0o100644, 0, 0)
    big = mk(ROOT, b"big", 0o40755, 0, 0).ino  # past PACKED_MAX: a dict
    for i in range(700):
        mk(big, b"name-%026d" % i, 0o100644, 0, 0)
    assert type(fs.ns.table.dirs[packed]) is PackedEntries and type(fs.ns.table.dirs[big]) is dict
    assert fs.ns.table.links[fs.ns.table.kind[packed]] == NLINK_TOP  # 202 links: wide_nlink


def _names(fs: Filesystem) -> list[tuple[int, bytes]]:
    """(directory, name) of every entry, and a missing name in each directory."""
    out = []
    for ino in list(fs.ns.table.inos()):
        if fs.ns.table.mode_of(ino) & 0o170000 == stat.S_IFDIR:
            out += [(ino, name) for name, _ in fs.ns.table.children(ino)] + [(ino, b"missing"), (ino, b"fff")]
    return out


def test_c_answers_as_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        ops = Operations(fs)
        await _tree(fs)
        t = fs.ns.table
        ops._entry_timeout, ops._attr_timeout = 120.0, 60.0
        with _serving(t, fs.volumes, 120.0, 60.0, getattr_too=True, atime="noatime"):
            answered: set[str] = set()
            for parent, name in _names(fs):
                child = t.child(parent, name)
                before = t.lookups[child] if child else 0
                got, c = fuseshim.meta_lookup(parent, name)
                if got:
                    after_c = t.lookups[child] if child else 0
                    python = _python(await ops.lookup(parent, name, CTX), entry=True)
                    assert c == python, (parent, name)
                    assert got == (1 if child else 2)
                    if child:
                        assert after_c == before + 1 and t.lookups[child] == before + 2, "a reference each"
                        answered.add(name.decode())
                    else:
                        answered.add("miss")
                elif child:
                    assert t.lookups[child] == before, "no reference taken where Python serves it"
            for ino in t.inos():
                c = fuseshim.meta_getattr(ino)
                if c is not None:
                    assert c == _python(await ops.getattr(ino, CTX), entry=False), ino
            served = {name for name in ["dir", "empty", "0123456789abcdef0123456789abcdef", "1700000000.12345.data",
                                        "1700000000.00001.meta", "plain", "holes", "huge", "hardlink", "symlink",
                                        "fifo", "socket", "unflushed", "abc", "00ff" * 8, "only", "packed", "varied", "big", "00a", "n0", "nnnn3", "name-%026d" % 5,
                                        "miss"]}
            assert served <= answered, served - answered
            assert "chr" not in answered and "over" not in answered  # left to Python
            assert fuseshim.meta_getattr(ROOT + 10**6) is None

    with_filesystem(tmp_path, body)


def test_nothing_answered_without_a_table(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        await _tree(fs)
        with _serving(fs.ns.table, fs.volumes, 1.0, 1.0, getattr_too=False, atime="noatime"):
            assert fuseshim.meta_lookup(ROOT, b"dir")[0] == 1
            assert fuseshim.meta_getattr(ROOT) is None, "GETATTR is Python's while files may be staged"
        assert fuseshim.meta_lookup(ROOT, b"dir") == (0, ())

    with_filesystem(tmp_path, body)


# A READDIRPLUS reply's entry (linux/fuse.h): fuse_entry_out, then fuse_dirent and the name.
_DIRENTPLUS = struct.Struct("<QQQQII QQQQQQIIIIIIIIII QQII")


def _entries(reply: bytes) -> list[tuple[bytes, int, int, tuple[int, ...]]]:
    """(name, offset, entry timeout ms, attributes as fuseshim.MetaAnswer's first 12) of each entry."""
    out, at = [], 0
    while at < len(reply):
        (nodeid, _, entry_valid, attr_valid, entry_ns, attr_ns, ino, size, blocks, atime, mtime, ctime, atime_ns,
         mtime_ns, ctime_ns, mode, nlink, uid, gid, rdev, blksize, _, d_ino, off, namelen, _) = \
            _DIRENTPLUS.unpack_from(reply, at)
        name = reply[at + _DIRENTPLUS.size:at + _DIRENTPLUS.size + namelen]
        assert nodeid == ino == d_ino
        attrs = (ino, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime * 10**9 + atime_ns,
                 mtime * 10**9 + mtime_ns, ctime * 10**9 + ctime_ns)
        out.append((name, off, entry_valid * 1000 + entry_ns // 10**6, attrs))
        at += (_DIRENTPLUS.size + namelen + 7) // 8 * 8
    return out


def test_whole_listings_as_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        await _tree(fs)
        t = fs.ns.table
        with _serving(t, fs.volumes, 120.0, 60.0, getattr_too=True, atime="noatime"):
            whole = set()
            for d in [ino for ino in t.inos() if t.mode_of(ino) & 0o170000 == stat.S_IFDIR]:
                children = fs.ns.listdir(d)
                before = {ino: t.lookups[ino] for _, ino in children}
                got = fuseshim.meta_listing(d, 4096)
                if got is None:  # too big for one reply, or an entry C leaves to Python
                    assert {ino: t.lookups[ino] for _, ino in children} == before, "no reference taken"
                    continue
                reply, end = got
                entries = _entries(reply)
                assert [(n, o) for n, o, _, _ in entries] == [(n, i + 1) for i, (n, _) in enumerate(children)]
                assert end == len(children)
                for (name, _, entry_ms, attrs), (_, ino) in zip(entries, children):
                    assert entry_ms == 120000 and attrs == fuseshim.meta_getattr(ino)[:12], name
                    assert t.lookups[ino] == before[ino] + [i for _, i in children].count(ino)
                whole.add(d)
            names = {fs.ns.lookup(ROOT, n).ino for n in (b"dir", b"empty", b"abc", b"lone")}
            assert names <= whole, "small listings are answered whole"
            assert fs.ns.lookup(ROOT, b"big").ino not in whole and ROOT not in whole  # (ROOT holds a device)

    with_filesystem(tmp_path, body)


def test_a_listing_that_sets_atime_is_left_to_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        await _tree(fs)
        d = fs.ns.lookup(ROOT, b"lone")
        now = time.time_ns()
        day = 24 * 3600 * 10**9
        s = 10**9
        for rule, atime, mtime, python in (("strictatime", now, now - 2 * s, True),
                                           ("relatime", now - 3 * s, now - 2 * s, True),  # older than mtime
                                           ("relatime", now - day - s, now - 3 * day, True),  # a day old
                                           ("relatime", now - s, now - 2 * s, False), ("noatime", 0, now, False)):
            d.set_times(atime, mtime, mtime)
            with _serving(fs.ns.table, fs.volumes, 1.0, 1.0, getattr_too=True, atime=rule):
                assert (fuseshim.meta_listing(d.ino, 4096) is None) == python, (rule, atime)

    with_filesystem(tmp_path, body)


async def _python_read(fs: Filesystem, ino: int, size: int, offset: int) -> bytes:
    fh = fs.open(ino)
    try:
        return await fs.read(fh, offset, size)
    finally:
        await fs.release(fh)


def _record(fs: Filesystem, ino: int) -> tuple[str, int]:
    """The volume file and offset of a file's one whole record."""
    (_, _, volume, offset, _, _), = fs.ns.table.extent_list(ino)
    return fs.volumes.path(volume), offset


def test_reads_answered_as_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        big = fs.create(ROOT, b"record-100k", 0o100644, 0, 0).ino
        await _write(fs, big, 0, os.urandom(100 << 10))
        await _tree(fs)  # (after: a commit would flush its unflushed runs)
        t = fs.ns.table
        v = fs.volumes  # what C reads of the Volumes (tablelayout.STORE), as it reads them
        assert (type(v.fds), type(v._inflight), type(v.pack_id)) == (dict, dict, int)
        assert not any(isinstance(getattr(type(v), name, None), property) for name in tablelayout.STORE.values())
        with _serving(t, fs.volumes, 120.0, 60.0, getattr_too=True, atime="noatime"):
            answered = set()
            for ino in [i for i in t.inos() if t.mode_of(i) & 0o170000 == stat.S_IFREG]:
                for size, offset in ((1, 0), (4096, 0), (131072, 0), (10, 4090), (4096, 4096), (100, 1 << 30)):
                    c = fuseshim.meta_read(ino, size, offset)
                    if c is not None:
                        assert c == await _python_read(fs, ino, size, offset), (ino, size, offset)
                        answered.add(ino)
            data = fs.ns.lookup(fs.ns.lookup(fs.ns.lookup(ROOT, b"dir").ino, b"0123456789abcdef0123456789abcdef").ino,
                                b"1700000000.12345.data").ino
            assert {data, big} <= answered, "whole records in the page cache are read in C"
            left = {fs.ns.lookup(ROOT, n).ino for n in (b"holes", b"huge", b"over", b"unflushed")}
            assert not left & answered, "extents, holes and unflushed runs are Python's"

            path, offset = _record(fs, data)
            fs.volumes._inflight[(t.extent_list(data)[0][2], offset)] = []  # as while the log writes it
            assert fuseshim.meta_read(data, 4096, 0) is None, "a record queued in the log is Python's"
            fs.volumes._inflight.clear()

            fd = os.open(path, os.O_RDWR)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                assert fuseshim.meta_read(data, 4096, 0) is None, "a record not in the page cache is Python's"
                assert await _python_read(fs, data, 4096, 0) == b"x" * 4096
                os.pread(fd, 48 + 4096, offset)  # (Python's read may have come from its read cache)
                assert fuseshim.meta_read(data, 4096, 0) == b"x" * 4096, "... and C's once it is back"
            finally:
                os.close(fd)
            victim = fs.create(ROOT, b"victim", 0o100644, 0, 0).ino  # (read by nobody yet: in no read cache)
            await _write(fs, victim, 0, b"v" * 4096)
            assert fuseshim.meta_read(victim, 4096, 0) == b"v" * 4096
            path, offset = _record(fs, victim)
            fd = os.open(path, os.O_RDWR)
            try:
                os.pwrite(fd, b"!", offset + 48 + 100)  # a corrupt payload
            finally:
                os.close(fd)
            assert fuseshim.meta_read(victim, 4096, 0) is None
            with pytest.raises(FsError) as e:
                await _python_read(fs, victim, 4096, 0)
            assert e.value.errno == errno.EIO, "Python says EIO, and logs why"

    with_filesystem(tmp_path, body)


def test_a_read_that_sets_atime_is_left_to_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        ino = fs.create(ROOT, b"f", 0o100644, 0, 0).ino
        await _write(fs, ino, 0, b"f" * 100)
        node = fs.ns.find(ino)
        now = time.time_ns()
        node.set_times(now - 3 * 10**9, now - 2 * 10**9, now - 2 * 10**9)  # atime older than mtime
        for rule, noatime, python in (("relatime", False, True), ("relatime", True, False),
                                      ("strictatime", False, True), ("noatime", False, False)):
            with _serving(fs.ns.table, fs.volumes, 1.0, 1.0, getattr_too=True, atime=rule):
                assert (fuseshim.meta_read(ino, 100, 0, noatime) is None) == python, (rule, noatime)
        with _serving(fs.ns.table, fs.volumes, 1.0, 1.0, getattr_too=False, atime="noatime"):
            assert fuseshim.meta_read(ino, 100, 0) is None, "a READ is Python's while files may be staged"

    with_filesystem(tmp_path, body)


def _swift_object(fs: Filesystem, name: bytes, i: int) -> int:
    """A file with Swift's two xattrs: its pickled metadata and that pickle's MD5."""
    ino = fs.create(ROOT, name, 0o100644, 0, 0).ino
    meta = pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1700000000.%05d" % i,
                         b"Content-Length": b"4096", b"ETag": hashlib.md5(b"%d" % i).hexdigest().encode(),
                         b"Content-Type": b"application/octet-stream"}, 2)
    fs.setxattrs(ino, [(b"user.swift.metadata", meta),
                       (b"user.swift.metadata_checksum", hashlib.md5(meta).hexdigest().encode())])
    return ino


def test_xattrs_taken_as_python(tmp_path: Path) -> None:
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        await _tree(fs)
        t = fs.ns.table
        swift = [_swift_object(fs, b"swift%d" % i, i) for i in range(3)]
        fs.setxattr(ROOT, b"user.dir", b"a directory's")
        fs.setxattr(fs.ns.lookup(ROOT, b"dir").ino, b"trusted.big", os.urandom(2000))  # not compressed: random
        while t.compress_xattrs():
            pass
        fresh = _swift_object(fs, b"fresh", 9)  # set plain, not compressed yet
        assert all(is_compressed(t.packed_xattrs(i)) and t.packed_xattrs(i)[:2] == SWIFT_FORM_PREFIX for i in swift)
        with _serving(t, fs.volumes, 1.0, 1.0, getattr_too=True, atime="noatime"):
            taken = set()
            for ino in t.inos():
                c = fuseshim.meta_xattrs(ino)
                if c is not None:
                    assert c == (t.plain_xattrs(ino) or b""), ino
                    taken.add(ino)
            assert {*swift, fresh, ROOT, fs.ns.lookup(ROOT, b"dir").ino, fs.ns.lookup(ROOT, b"holes").ino} <= taken
            assert fuseshim.meta_xattrs(ROOT + 10**6) is None, "no inode there"
            t._xnew = t.xblobs  # as while a compaction of the arena runs
            assert fuseshim.meta_xattrs(swift[0]) is None, "Python's while the arena is compacted"
            t._xnew = None
            t.kid[swift[1]] = IN_CATALOG  # as with xattrs_in_memory off, once checkpointed
            assert fuseshim.meta_xattrs(swift[1]) is None, "values only the catalog holds are Python's"

    with_filesystem(tmp_path, body)


def test_xattrs_a_record_carries_taken_as_python(tmp_path: Path) -> None:
    """IN_RECORD (xattrs_in_memory off): C reads a file's xattrs from its record in the page
    cache, as Python reads them; a record not in the page cache, or whose trailer is not
    intact, is Python's (which reads it, or says EIO)."""
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        t = fs.ns.table
        swift = []
        for i, size in enumerate((64, 4096, 10 << 10)):
            ino = _swift_object(fs, b"swift%d" % i, i)
            await _write(fs, ino, 0, os.urandom(size))  # flushed with its xattrs set: they ride along
            swift.append(ino)
        await fs.fsync()
        await fs.journal.checkpoint()
        await fs.volumes.wait_written(fs.volumes.last_ticket)
        assert [t.xref(ino) for ino in swift] == [IN_RECORD] * 3
        with _serving(t, fs.volumes, 1.0, 1.0, getattr_too=True, atime="noatime"):
            for ino in swift:
                path, offset = _record(fs, ino)
                fd = os.open(path, os.O_RDWR)
                try:
                    os.pread(fd, 4096 * 4, offset)  # in the page cache
                    assert fuseshim.meta_xattrs(ino) == t.plain_xattrs(ino)
                    assert [n for n, _, _ in iter_xattrs(t.plain_xattrs(ino))] == [
                        b"user.swift.metadata", b"user.swift.metadata_checksum"]
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    assert fuseshim.meta_xattrs(ino) is None, "a record not in the page cache is Python's"
                finally:
                    os.close(fd)
            ino = swift[0]
            path, offset = _record(fs, ino)
            fd = os.open(path, os.O_RDWR)
            try:
                os.pwrite(fd, b"!", offset + 48 + 64 + 3)  # a corrupt trailer
                os.pread(fd, 4096, offset)
            finally:
                os.close(fd)
            t._fetched.clear()
            assert fuseshim.meta_xattrs(ino) is None
            with pytest.raises(FsError) as e:
                t.plain_xattrs(ino)
            assert e.value.errno == errno.EIO, "Python says EIO, and logs why"

    with_filesystem(tmp_path, body, xattrs_in_memory=False)
