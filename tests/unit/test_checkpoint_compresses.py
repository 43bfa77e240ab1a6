"""Every xattr blob the catalog gets is compressed, without FUSE.

setxattr stores Swift's metadata plain and the compressor compresses it later, in
memory. A checkpoint compresses what waits before it takes the namespace, but its
snapshot takes turns of the event loop: blobs set in those turns were taken plain, and
compressing them later changed no row, so the catalog, and a table loaded from it (a
mount after a crash, the image an import leaves), kept them plain (~440 B against ~60).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import stat
from pathlib import Path

import pytest
import trio
from started import with_filesystem

from packfs.core import journal, pack as packmod
from packfs.core.filesystem import Filesystem
from packfs.importer import build, run_import
from packfs.namespace import image
from packfs.namespace.namespace import ROOT
from packfs.namespace.xattrblob import is_compressed
from packfs.namespace.xattrstore import IN_RECORD
from packfs.options import Options
from packfs.store.disk import Disk

REG = stat.S_IFREG | 0o644


def _metadata(i: int) -> list[tuple[bytes, bytes]]:
    """Swift's two xattrs of an object, as its object server writes them (the Swift form's)."""
    md = pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1700000000.%05d" % i,
                       b"Content-Type": b"application/octet-stream", b"Content-Length": b"64",
                       b"ETag": hashlib.md5(b"%d" % i).hexdigest().encode()}, 2)
    return [(b"user.swift.metadata", md), (b"user.swift.metadata_checksum", hashlib.md5(md).hexdigest().encode())]


def _reopened_blobs(packdir: str, xattrs_in_memory: bool, in_records: int = 0) -> dict[int, bytes]:
    """Each file's packed xattrs in the pack opened again (the catalog, or its image),
    but for the `in_records` files whose record carries them (read back as written there:
    see xattrstore.trailer_for)."""
    p = packmod.open_pack(packdir, Disk(), 1 << 30, 8 << 20, xattrs_in_memory=xattrs_in_memory)
    try:
        t = p.ns.table
        files = [ino for ino in t.inos() if stat.S_ISREG(t.mode_of(ino))]
        assert sum(t.xref(ino) == IN_RECORD for ino in files) == in_records
        return {ino: t.packed_xattrs(ino) for ino in files if t.xref(ino) != IN_RECORD}
    finally:
        p.volumes.close()
        p.catalog.close()


def _assert_all_compressed(blobs: dict[int, bytes], files: int) -> None:
    assert len(blobs) == files
    left_plain = [ino for ino, x in blobs.items() if x is None or not is_compressed(x)]
    assert not left_plain, f"{len(left_plain)} of {files} blobs are plain after the reopen"
    assert all(x[:2] == b"\xff\xfd" for x in blobs.values())  # the Swift form


@pytest.mark.parametrize("xattrs_in_memory", [True, False])
def test_blobs_set_during_a_checkpoints_snapshot_reach_the_catalog_compressed(tmp_path: Path,
                                                                             xattrs_in_memory: bool):
    values: dict[bytes, bytes] = {}

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        fs.journal.snapshot_part = 3  # many turns of the loop in the checkpoint's snapshot
        n = 0

        def put() -> None:
            nonlocal n
            node = fs.create(ROOT, b"o%d" % n, REG, 0, 0)
            fs.setxattrs(node.ino, _metadata(n))
            values[b"o%d" % n] = fs.ns.table.plain_xattrs(node.ino)
            n += 1

        for _ in range(30):
            put()
        await fs.fsync()
        done = trio.Event()

        async def checkpoint() -> None:
            await fs.journal.checkpoint()
            done.set()
        nursery.start_soon(checkpoint)
        while not done.is_set():  # Swift's PUTs, one a turn, while it runs
            put()
            await trio.lowlevel.checkpoint()
        assert n > 40, "no PUT came during the checkpoint"
        # (the mount's close checkpoints once more)

    with_filesystem(tmp_path, body, xattrs_in_memory=xattrs_in_memory)
    blobs = _reopened_blobs(str(tmp_path / "pack"), xattrs_in_memory)
    _assert_all_compressed(blobs, len(values))
    p = packmod.open_pack(str(tmp_path / "pack"), Disk(), 1 << 30, 8 << 20)
    try:  # the same values: compressing changed none
        got = {name: p.ns.table.plain_xattrs(ino) for name, ino in p.ns.table.children(ROOT)}
    finally:
        p.volumes.close()
        p.catalog.close()
    assert got == values


def test_an_imported_swift_trees_blobs_are_all_compressed(tmp_path: Path, monkeypatch):
    """Those the catalog holds: objects whose data ends too near a block's end for their
    record to carry the metadata (most objects' records carry it)."""
    monkeypatch.setattr(build, "CHECKPOINT_INODES", 100)  # background checkpoints beside the walk
    monkeypatch.setattr(build, "TURN_ENTRIES", 4)
    monkeypatch.setattr(journal, "SNAPSHOT_PART", 5)
    src = tmp_path / "src"
    files = in_records = 0
    for d in range(6):
        part = src / "objects" / str(d) / "abc"
        part.mkdir(parents=True)
        for i in range(80):
            f = part / f"{i:04d}.data"
            roomy = i % 4 == 0
            f.write_bytes(b"x" * (64 if roomy else 4096 - 48 - 8))
            for name, value in _metadata(d * 1000 + i):
                os.setxattr(f, name, value)
            files += 1
            in_records += roomy
    run_import(str(src), str(tmp_path / "pack"))  # leaves the image a default mount loads
    default = Options().xattrs_in_memory
    _assert_all_compressed(_reopened_blobs(str(tmp_path / "pack"), default, in_records), files - in_records)
    os.unlink(tmp_path / "pack" / image.FILENAME)  # the catalog, with every value loaded
    _assert_all_compressed(_reopened_blobs(str(tmp_path / "pack"), True, in_records), files - in_records)
