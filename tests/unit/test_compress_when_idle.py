"""The xattr compressor after a commit the event loop flushed itself, without FUSE.

Such a commit is a lone fsync's: the loop writes and flushes it, then replies, and the
requester's next request follows at once (a Swift PUT lists the object's directory).
The compressor's turn waits until the loop has no request to read (Journal.when_idle,
called by fuseloop.Drain before it sleeps), unless many blobs wait for it already.
"""
from __future__ import annotations

import pickle
import stat
from pathlib import Path

import trio
import trio.testing
from started import with_filesystem

from packfs.core import journal
from packfs.core.filesystem import Filesystem
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644


def _metadata(i: int) -> bytes:
    """Swift's metadata as its object server pickles it (compressible)."""
    return pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1700000000.%05d" % i,
                         b"Content-Type": b"application/octet-stream", b"Content-Length": b"4096",
                         b"ETag": b"d41d8cd98f00b204e9800998ecf8427e"}, 2)


async def _put(fs: Filesystem, i: int) -> None:
    """A file with Swift's metadata, then a lone fsync (the loop flushes it)."""
    node = fs.create(ROOT, b"o%d" % i, REG, 0, 0)
    fs.setxattr(node.ino, b"user.swift.metadata", _metadata(i))
    await fs.fsync(alone=True)
    await trio.testing.wait_all_tasks_blocked()


def test_a_lone_commit_leaves_compression_until_the_loop_is_idle(tmp_path: Path):
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        fs.journal.idle_hook = True
        for i in range(6):
            await _put(fs, i)
        table = fs.ns.table
        assert table.uncompressed() == 6, "the compressor ran after a lone commit"
        for i in range(6, 9):  # each idle period is a turn; a blob settles for two
            fs.journal.when_idle()
            await trio.testing.wait_all_tasks_blocked()
            await _put(fs, i)
        assert table.uncompressed() < 9, "idle periods did not compress"
        fs.journal.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        left = table.uncompressed()
        assert left <= 2, "more than the last two turns' blobs wait"
        fs.journal.when_idle()  # nothing deferred since: no turn
        await trio.testing.wait_all_tasks_blocked()
        assert table.uncompressed() == left

    with_filesystem(tmp_path, body)


def test_a_loop_never_idle_still_compresses(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(journal, "COMPRESS_DEFER_MAX", 4)

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        fs.journal.idle_hook = True
        for i in range(12):
            await _put(fs, i)
        assert fs.ns.table.uncompressed() < 12, "without an idle loop nothing was compressed"

    with_filesystem(tmp_path, body)


def test_without_the_idle_hook_a_lone_commit_compresses_as_before(tmp_path: Path):
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        for i in range(6):
            await _put(fs, i)
        assert fs.ns.table.uncompressed() < 6

    with_filesystem(tmp_path, body)
