"""FORGET without FUSE: the kernel's dropped references are applied at once when the batch
is small and none waits, else by a background task a part per turn of the event loop, so
the hundreds of thousands a cold walk's evicted inodes give back do not hold the requests
that come meanwhile."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest
import trio
from test_recovery import run

from packfs.core import filesystem
from packfs.core import pack as packmod
from packfs.store.disk import Disk
from packfs.core.filesystem import Filesystem
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644


@pytest.fixture
def packdir(tmp_path: Path) -> Path:
    packmod.initialise(str(tmp_path / "pack"), Disk())
    return tmp_path / "pack"


def test_a_large_forget_is_applied_in_parts_between_other_work(packdir: Path):
    parts = 5
    n = filesystem.FORGET_PART * parts

    async def body(fs: Filesystem) -> None:
        files = [fs.create(ROOT, b"f%d" % i, REG, 0, 0) for i in range(n)]
        for f in files:
            f.lookups = 1
        last = files[-1]
        fs.unlink(ROOT, b"f%d" % (n - 1))  # the kernel still holds it: it stays
        assert fs.ns.find(last.ino) is not None
        fs.forget([(f.ino, 1) for f in files])
        assert files[0].lookups == 1  # nothing applied yet: the request is answered at once
        turns = 0
        while fs.ns.find(last.ino) is not None:
            turns += 1
            await trio.lowlevel.checkpoint()
            assert turns < 100 * parts
        assert turns >= parts and all(f.lookups == 0 for f in files[:-1])

    run(packdir, body, clean=False)


def test_a_batch_of_at_most_a_part_is_applied_at_once_unless_others_wait(packdir: Path):
    """Queued, batches piled up as lists of tuples, and their memory stayed with the daemon."""
    async def body(fs: Filesystem) -> None:
        a, b = fs.create(ROOT, b"a", REG, 0, 0), fs.create(ROOT, b"b", REG, 0, 0)
        a.lookups = b.lookups = 1
        fs.unlink(ROOT, b"a")
        fs.forget([(a.ino, 1)])
        assert fs.ns.find(a.ino) is None  # no turn of the loop needed
        fs.forget([(b.ino, 0)] * (filesystem.FORGET_PART + 1))  # more than a part: queued
        fs.forget([(b.ino, 1)])  # so this one waits behind it
        assert b.lookups == 1
        while b.lookups:
            await trio.lowlevel.checkpoint()

    run(packdir, body, clean=False)


def test_close_applies_the_forgets_still_waiting(packdir: Path):
    async def body(fs: Filesystem) -> None:
        f = fs.create(ROOT, b"f", REG, 0, 0)
        f.lookups = 1
        fs.unlink(ROOT, b"f")
        fs.forget([(f.ino, 1)] * 2 + [(f.ino, 0)] * filesystem.FORGET_PART)
        await fs.close()
        assert fs.ns.find(f.ino) is None
        assert f.ino not in [row[0] for row in fs.pack.catalog.inode_rows()]  # nor in the final checkpoint

    run(packdir, body, clean=False)
