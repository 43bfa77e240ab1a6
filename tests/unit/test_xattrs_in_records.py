"""A file's xattrs carried in its record's padding (format 6), without FUSE.

With xattrs_in_memory off, a file flushed as one whole record with its xattrs set (Swift's
PUT) writes them in the record's padding; the checkpoint that takes the file lets go of
them in memory (IN_RECORD) and writes IN_RECORD_ROW for them in the catalog. A GET reads
them with the record. These tests hold the values against what was set through every way
a table is made again (the catalog, the image, the log's replay), through later changes
to the file, and through fsck; and a damaged trailer is an EIO, not another value.
"""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import stat
from pathlib import Path

import pytest
import trio
from started import with_filesystem

from packfs.core import pack as packmod
from packfs.core.filesystem import Filesystem, Setattr
from packfs.errors import FsError
from packfs.fsck import check
from packfs.namespace.namespace import ROOT
from packfs.namespace.xattrstore import IN_CATALOG, IN_RECORD, IN_RECORD_ROW
from packfs.namespace.xattrblob import iter_xattrs
from packfs.store import records
from packfs.store.disk import Disk

REG = stat.S_IFREG | 0o644
PACK_ID = 7


def _metadata(i: int, size: int) -> list[tuple[bytes, bytes]]:
    """Swift's two xattrs of an object, as its object server writes them."""
    md = pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1700000000.%05d" % i,
                       b"Content-Type": b"application/octet-stream", b"Content-Length": b"%d" % size,
                       b"ETag": hashlib.md5(b"%d" % i).hexdigest().encode()}, 2)
    return [(b"user.swift.metadata", md), (b"user.swift.metadata_checksum", hashlib.md5(md).hexdigest().encode())]


# -- the record format -------------------------------------------------------------


def test_a_trailer_rides_in_the_padding_and_leaves_the_payload_as_it_was():
    blob = b"m" * 60
    parts = records.encode(records.DATA, 5, 9, 0, [b"d" * 64], PACK_ID, trailer=blob)
    raw = b"".join(parts)
    assert len(raw) == records.BLOCK  # no space of its own
    header = records.decode_header(raw, PACK_ID)
    assert (header.length, header.trailer) == (64, 60)
    records.check_payload(header, raw[records.HEADER_SIZE:records.HEADER_SIZE + 64])
    assert records.trailer_of(header, raw) == blob
    plain = records.decode_header(b"".join(records.encode(records.DATA, 5, 9, 0, [b"d" * 64], PACK_ID)), PACK_ID)
    assert plain.trailer == 0 and plain.payload_crc == header.payload_crc
    with pytest.raises(records.RecordError):
        records.trailer_of(plain, raw)
    damaged = bytearray(raw)
    damaged[records.HEADER_SIZE + 64 + 10] ^= 1
    with pytest.raises(records.RecordError, match="xattrs checksum"):
        records.trailer_of(header, damaged)


@pytest.mark.parametrize("payload, blob, fits", [
    (64, 60, True), (0, 60, True), (4096 - 48 - 64, 60, True), (4096 - 48 - 64, 61, False),
    (4096 - 48 - 63, 60, False), (4096, 4044, True), (4096, 4045, False), (64, 0, False), (64, 1 << 16, False)])
def test_a_trailer_fits_only_in_the_padding(payload: int, blob: int, fits: bool):
    assert records.trailer_fits(payload, blob) is fits


# -- through the core ---------------------------------------------------------------


async def _put(fs: Filesystem, name: bytes, data: bytes, xattrs: list[tuple[bytes, bytes]]) -> int:
    """Swift's PUT: create, write, set the metadata, fsync."""
    node = fs.create(ROOT, name, REG, 0, 0)
    fh = fs.created_handle(node.ino, privileged=True)
    await fs.write(fh, 0, data)
    fs.setxattrs(node.ino, xattrs)
    await fs.fsync(fh=fh)
    await fs.release(fh)
    return node.ino


def _reopened(packdir: str, xattrs_in_memory: bool = False) -> packmod.Pack:
    return packmod.open_pack(packdir, Disk(), 1 << 30, 8 << 20, xattrs_in_memory=xattrs_in_memory)


def _values(p: packmod.Pack) -> dict[bytes, tuple[int, bytes | None]]:
    """Each file's name: (where its xattrs are, its xattrs packed plain)."""
    t = p.ns.table
    return {name: (t.xref(ino), t.plain_xattrs(ino)) for name, ino in t.children(ROOT)}


def _closed(p: packmod.Pack) -> None:
    p.volumes.close()
    p.catalog.close()


def _catalog_xattrs(packdir: str) -> dict[int, bytes | None]:
    p = _reopened(packdir, True)
    try:
        return dict(p.catalog.db.execute("SELECT ino, xattrs FROM inodes WHERE mode & 61440 = 32768"))
    finally:
        _closed(p)


def _assert_read_back(packdir: str, want: dict[bytes, bytes | None], xattrs_in_memory: bool) -> None:
    """The pack reopened gives each file the xattrs wanted, and fsck finds nothing wrong."""
    p = _reopened(packdir, xattrs_in_memory)
    try:
        assert {n: x for n, (_, x) in _values(p).items()} == want
    finally:
        _closed(p)
    report = check(packdir)
    assert not report.problems and not report.error


SIZES = [0, 64, 4096, 4096 - 48 - 8]  # none, small, a block, one that leaves no room


def test_swift_objects_xattrs_leave_memory_for_their_records(tmp_path: Path):
    """The catalog holds IN_RECORD_ROW, memory holds IN_RECORD, for every object whose
    record has room; the others (no data, no room) keep theirs in the catalog. Every way
    back (image, catalog, after a later write or setxattr) reads the same values."""
    want: dict[bytes, bytes] = {}

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        t = fs.ns.table
        for i, size in enumerate(SIZES):
            ino = await _put(fs, b"o%d" % i, os.urandom(size), _metadata(i, size))
            want[b"o%d" % i] = t.plain_xattrs(ino)
        await fs.journal.checkpoint()
        where = {name: t.xref(ino) for name, ino in t.children(ROOT)}
        assert where == {b"o0": IN_CATALOG, b"o1": IN_RECORD, b"o2": IN_RECORD, b"o3": IN_CATALOG}
        assert t.xattrs_in_memory() == 0
        for i, size in enumerate(SIZES):  # read back through the core, as a GET does
            ino = t.child(ROOT, b"o%d" % i)
            for name, value in _metadata(i, size):
                assert await fs.getxattr(ino, name) == value

    packdir = str(tmp_path / "pack")
    with_filesystem(tmp_path, body, xattrs_in_memory=False)
    for loaded_from in ("catalog", "image"):  # (the first leaves an image, as an unmount does)
        p = _reopened(packdir)
        try:
            assert p.loaded_from == loaded_from
            got = _values(p)
            p.save_image()
        finally:
            _closed(p)
        assert {n: x for n, (_, x) in got.items()} == want
        assert {n for n, (ref, _) in got.items() if ref == IN_RECORD} == {b"o1", b"o2"}
    rows = _catalog_xattrs(packdir)
    assert sorted(x == IN_RECORD_ROW for x in rows.values()) == [False, False, True, True]
    # With xattrs_in_memory on, values already in records stay there, and read the same.
    _assert_read_back(packdir, want, True)


def test_a_change_to_the_file_brings_its_xattrs_back_first(tmp_path: Path):
    """A write, a truncate and a setxattr on files whose records carry their xattrs: each
    keeps the values right, in memory, in the catalog and after a remount."""
    want: dict[bytes, bytes] = {}

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        t = fs.ns.table
        inos = [await _put(fs, b"o%d" % i, b"x" * 100, _metadata(i, 100)) for i in range(3)]
        await fs.journal.checkpoint()
        assert [t.xref(ino) for ino in inos] == [IN_RECORD] * 3
        fh = fs.open(inos[0])
        await fs.write(fh, 100, b"more")  # appended: another extent
        await fs.fsync(fh=fh)
        await fs.release(fh)
        await fs.setattr(inos[1], Setattr(size=10))  # cut: the record is no longer the file
        fs.setxattr(inos[2], b"user.other", b"v")  # new values: memory holds them
        for i, ino in enumerate(inos):
            assert t.xref(ino) not in (IN_RECORD, IN_CATALOG)
            want[b"o%d" % i] = t.plain_xattrs(ino)
        assert set(await fs.listxattr(inos[2])) == {b"user.swift.metadata", b"user.swift.metadata_checksum",
                                                    b"user.other"}
        await fs.journal.checkpoint()

    packdir = str(tmp_path / "pack")
    with_filesystem(tmp_path, body, xattrs_in_memory=False)
    assert not [x for x in _catalog_xattrs(packdir).values() if x == IN_RECORD_ROW]
    _assert_read_back(packdir, want, False)


def test_a_crash_replays_the_log_rows_that_say_the_record_carries_them(tmp_path: Path):
    """A recovery (no clean close) reads every value back: of objects the log alone holds
    (their commit's rows say IN_RECORD_ROW, xattrs_in_memory being off), and of one
    whose later commit (a chmod) logs its row again, IN_RECORD_ROW."""
    want: dict[bytes, bytes] = {}
    packdir = str(tmp_path / "pack")
    packmod.initialise(packdir, Disk())
    p = _reopened(packdir)

    async def main() -> None:
        from packfs.options import Options
        fs = Filesystem(p, Options(commit_interval=0, xattrs_in_memory=False))
        async with trio.open_nursery() as nursery:
            await fs.start(nursery)
            t = fs.ns.table
            for i in range(4):
                ino = await _put(fs, b"o%d" % i, b"y" * 200, _metadata(i, 200))
                want[b"o%d" % i] = t.plain_xattrs(ino)
            await fs.journal.checkpoint()
            node = fs.ns.lookup(ROOT, b"o0")
            await fs.setattr(node.ino, Setattr(mode=0o600))  # a commit whose row says IN_RECORD_ROW
            await fs.fsync()
            for i in range(4, 6):  # and objects the log alone holds
                ino = await _put(fs, b"o%d" % i, b"y" * 200, _metadata(i, 200))
                want[b"o%d" % i] = t.plain_xattrs(ino)
            await fs.volumes.wait_durable(fs.volumes.last_ticket)
            nursery.cancel_scope.cancel()  # no close: as if the daemon were killed

    try:
        trio.run(main)
    finally:
        _closed(p)
    p = _reopened(packdir)
    try:
        assert p.recovery.replayed
        got = _values(p)
    finally:
        _closed(p)
    assert {n: x for n, (_, x) in got.items()} == want
    assert {n for n, (ref, _) in got.items() if ref == IN_RECORD} == set(want)  # catalog and log rows alike


def test_a_damaged_trailer_reads_as_eio_and_fsck_says_which_file(tmp_path: Path):
    inos: list[int] = []

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        for i in range(2):
            inos.append(await _put(fs, b"o%d" % i, b"z" * 64, _metadata(i, 64)))

    packdir = str(tmp_path / "pack")
    with_filesystem(tmp_path, body, xattrs_in_memory=False)
    p = _reopened(packdir)
    try:
        _, n, vol, off, _, _ = p.ns.table.extent_list(inos[1])[0]
        path = p.volumes.path(vol)
    finally:
        _closed(p)
    with open(path, "r+b") as f:  # a bit of the trailer's value flipped
        f.seek(off + records.HEADER_SIZE + n + 5)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    p = _reopened(packdir)
    try:
        assert p.ns.table.plain_xattrs(inos[0])
        with pytest.raises(FsError) as e:
            p.ns.table.plain_xattrs(inos[1])
        assert e.value.errno == errno.EIO
    finally:
        _closed(p)
    report = check(packdir)
    assert [(f.kind, f.ino) for f in report.problems] == [("unreadable-xattrs", inos[1])]
    assert "/o1" in report.problems[0].message



def test_a_damaged_record_fails_a_write_and_fsck_repairs_the_file_without_its_xattrs(tmp_path: Path):
    """A file whose record's header is damaged: its xattrs, which the record carried, do
    not read back, so a write to it says EIO (it reads the file's capability xattr) and
    changes nothing; fsck --repair moves it to lost+found with its damaged bytes as a hole
    and its xattrs gone (logged), and the pack is clean after."""
    inos: list[int] = []

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        t = fs.ns.table
        inos.append(await _put(fs, b"o", b"a" * 64, _metadata(0, 64)))
        await fs.journal.checkpoint()
        assert t.xref(inos[0]) == IN_RECORD
        _, _, vol, off, _, _ = t.extent_list(inos[0])[0]
        await fs.volumes.wait_written(fs.volumes.last_ticket)
        with open(fs.volumes.path(vol), "r+b") as f:
            f.seek(off + 20)  # the header's inode number: its CRC fails
            f.write(b"\xff")
        os.posix_fadvise(fs.volumes.fd(vol), 0, 0, os.POSIX_FADV_DONTNEED)
        fh = fs.open(inos[0])
        with pytest.raises(FsError) as e:
            await fs.write(fh, 0, b"b" * 100)
        assert e.value.errno == errno.EIO
        await fs.release(fh)
        assert t.xref(inos[0]) == IN_RECORD and t.extent_count(inos[0]) == 1

    packdir = str(tmp_path / "pack")
    with_filesystem(tmp_path, body, xattrs_in_memory=False)
    repaired = check(packdir, repair=True)
    assert not repaired.error and not repaired.problems
    assert [f.kind for f in check(packdir).problems] == []
    p = _reopened(packdir, True)
    try:
        t = p.ns.table
        lost = t.child(ROOT, b"lost+found")
        assert t.children(lost) == [(b"#%d" % inos[0], inos[0])]
        names = [n for n, _, _ in iter_xattrs(t.plain_xattrs(inos[0]))]
        assert names == [b"user.packfs.fsck"]  # Swift's metadata went with the damaged record
    finally:
        _closed(p)
