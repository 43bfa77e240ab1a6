"""Where a lone fsync's flush runs (Operations.alone), without FUSE.

A commit nothing else waits behind is written and flushed by the event loop itself. If
requests came while the loop was blocked in such a flush, the commits of the next
second leave their flushes to the log writer, so that other writers do not wait behind
them. Only a flush the loop really made counts: an fsync that committed nothing (a file
O_TMPFILE made and never named, a directory with no change since the last commit) blocks
nobody, whatever comes meanwhile.
"""
from __future__ import annotations

import contextlib
import os
import select
import stat
from pathlib import Path

import trio
from started import with_filesystem

from packfs.core.filesystem import Filesystem
from packfs.namespace.namespace import ROOT
from packfs.fuse.ops import Operations

REG = stat.S_IFREG | 0o644


def test_only_a_flush_on_the_loop_that_requests_waited_for_crowds_the_next_commits(tmp_path: Path):
    queue_r, queue_w = os.pipe()  # stands for /dev/fuse: readable while a request waits
    waiting = select.poll()
    waiting.register(queue_r, select.POLLIN)

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        ops = Operations(fs)
        ops.watch_queue(queue_r)
        fsync = fs.fsync

        async def fsync_while_a_request_comes(**kwargs) -> None:
            await fsync(**kwargs)
            os.write(queue_w, b"r")

        @contextlib.contextmanager
        def a_request_comes_during_fsync():
            fs.fsync = fsync_while_a_request_comes
            try:
                yield
            finally:
                fs.fsync = fsync

        def served() -> None:  # the request that came is read
            while waiting.poll(0):
                os.read(queue_r, 64)

        async def named_fsync(name: bytes) -> bool:
            """An fsync with something to commit, nothing coming: True if the loop flushed it."""
            fh = fs.open(fs.create(ROOT, name, REG, 0, 0).ino)
            await fs.write(fh, 0, b"x" * 5000)
            before = fs.volumes.flushes_on_loop
            await ops.fsync(fh, False)
            await fs.release(fh)
            return fs.volumes.flushes_on_loop == before + 1

        assert await named_fsync(b"first")

        # A file with no name: its fsync commits nothing.
        fh = fs.open(fs.create_unlinked(ROOT, REG, 0, 0).ino)
        await fs.write(fh, 0, b"y" * 5000)
        commits = fs.journal.commits
        with a_request_comes_during_fsync():
            await ops.fsync(fh, False)
        assert fs.journal.commits == commits
        await fs.release(fh)
        served()
        assert await named_fsync(b"after a nameless fsync"), "an fsync that flushed nothing crowded the next"

        # A directory with no change since the last commit: nothing to flush either.
        with a_request_comes_during_fsync():
            await ops.fsyncdir(ROOT, False)
        served()
        assert await named_fsync(b"after an idle fsyncdir"), "an fsync that flushed nothing crowded the next"

        # A flush the loop made while a request came: the next commits leave theirs to the writer.
        fh = fs.open(fs.create(ROOT, b"flushed", REG, 0, 0).ino)
        await fs.write(fh, 0, b"z" * 5000)
        before = fs.volumes.flushes_on_loop
        with a_request_comes_during_fsync():
            await ops.fsync(fh, False)
        await fs.release(fh)
        assert fs.volumes.flushes_on_loop == before + 1
        served()
        assert not await named_fsync(b"crowded"), "a request came during the loop's last flush"

    try:
        with_filesystem(tmp_path, body)
    finally:
        os.close(queue_r)
        os.close(queue_w)
