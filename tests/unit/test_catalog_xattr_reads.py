"""Reads of xattrs without FUSE: with noxattrs_in_memory a file's checkpointed xattrs are
read from the catalog in a worker thread, so the event loop serves other requests while
that read waits; names in namespaces packfs no longer takes stay readable."""
from __future__ import annotations

import errno
import stat
import threading
from pathlib import Path

import trio

from started import with_filesystem

from packfs.errors import FsError
from packfs.core.filesystem import Filesystem
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644
META = b"user.swift.metadata"


def test_a_catalog_read_of_xattrs_leaves_the_event_loop_free(tmp_path: Path):
    started, loop_ran = threading.Event(), threading.Event()

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        ino = fs.create(ROOT, b"f", REG, 0, 0).ino
        fs.setxattr(ino, META, b"m" * 300)
        await fs.journal.checkpoint()
        table = fs.ns.table
        assert table.xattrs_to_fetch(ino)  # the value left memory with the checkpoint
        from_catalog = table.fetch_xattrs

        def slow_read(i: int) -> bytes | None:
            started.set()
            assert loop_ran.wait(5), "the event loop stood still during the catalog read"
            return from_catalog(i)

        async def another_request() -> None:
            while not started.is_set():
                await trio.sleep(0.001)
            loop_ran.set()

        table.fetch_xattrs = slow_read
        nursery.start_soon(another_request)
        assert await fs.getxattr(ino, META) == b"m" * 300
        table.fetch_xattrs = from_catalog
        assert not table.xattrs_to_fetch(ino) and await fs.listxattr(ino) == [META]

    with_filesystem(tmp_path, body, xattrs_in_memory=False)
    assert started.is_set() and loop_ran.is_set()


def test_a_name_older_packs_took_stays_readable_and_removable(tmp_path: Path):
    """Names outside user., trusted. and security. are refused since 2026-11-27; one a
    file already has is still read and removed, not hidden behind EOPNOTSUPP."""

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        ino = fs.create(ROOT, b"f", REG, 0, 0).ino
        fs.ns.setxattr(ino, b"bogus.k", b"old")  # as an older packfs stored it
        assert await fs.getxattr(ino, b"bogus.k") == b"old"
        fs.removexattr(ino, b"bogus.k")
        for call in (lambda: fs.setxattr(ino, b"bogus.k", b"v"), lambda: fs.removexattr(ino, b"bogus.k")):
            try:
                call()
            except FsError as e:
                assert e.errno == errno.EOPNOTSUPP
            else:
                raise AssertionError("an unknown namespace was taken")

    with_filesystem(tmp_path, body)
