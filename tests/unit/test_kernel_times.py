"""Whose clock a file's data changes take their times from, without FUSE.

By default packfs sets mtime and ctime at every change of a file's data, as ext4 and
XFS do. With the kernel's writeback cache the kernel keeps a written file's mtime and
ctime itself and sends them later (on fsync, on the last close, when it writes the
inode back): a time of packfs's own would show until a remount, then be replaced by the
kernel's, or the other way round. So in that mode a write, a fallocate of any mode and a
truncate leave the times alone, and the times the kernel sends are kept as sent. (The
mount test that found the fallocate case failed in 2 of 25 runs; this one cannot pass by
chance.)
"""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Awaitable, Callable

import pytest
import trio
from started import with_filesystem

from packfs.core.filesystem import (FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,
                               Filesystem, Setattr)
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644
OLD = 1_000_000_000_000_000_000  # 2001-09-09, in ns: far from any time the clock gives now


def _fallocate(mode: int, offset: int, length: int) -> Callable[[Filesystem, int, int], Awaitable[None]]:
    async def change(fs: Filesystem, ino: int, fh: int) -> None:
        fs.fallocate(ino, mode, offset, length)
    return change


async def _write(fs: Filesystem, ino: int, fh: int) -> None:
    await fs.write(fh, 8192, b"w" * 100)


async def _truncate(fs: Filesystem, ino: int, fh: int) -> None:
    await fs.setattr(ino, Setattr(size=1000))


CHANGES = {
    "write": _write,
    "fallocate grow": _fallocate(0, 0, 20000),
    "fallocate reserve": _fallocate(FALLOC_FL_KEEP_SIZE, 0, 20000),
    "fallocate punch": _fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096),
    "fallocate zero range": _fallocate(FALLOC_FL_ZERO_RANGE, 0, 4096),
    "truncate": _truncate,
}


def _run(tmp_path: Path, kernel_keeps: bool, name: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Times of a written file set to OLD, then after the change named: (before, after)."""
    seen: list[tuple[int, int, int]] = []

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        node = fs.create(ROOT, b"f", REG, 0, 0)
        fh = fs.open(node.ino)
        await fs.write(fh, 0, b"x" * 10000)
        await fs.setattr(node.ino, Setattr(atime=OLD, mtime=OLD, ctime=OLD))
        seen.append(fs.ns.get(node.ino).times())
        await CHANGES[name](fs, node.ino, fh)
        seen.append(fs.ns.get(node.ino).times())
        await fs.release(fh)

    with_filesystem(tmp_path, body, writeback_cache=kernel_keeps)
    return seen[0], seen[1]


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_packfs_sets_mtime_and_ctime_at_a_data_change_by_default(tmp_path: Path, name: str):
    before, after = _run(tmp_path, False, name)
    assert before == (OLD, OLD, OLD)
    atime, mtime, ctime = after
    assert atime == OLD
    assert mtime > OLD and ctime > OLD, f"{name} left mtime or ctime as they were"


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_with_the_writeback_cache_a_data_change_leaves_the_times_to_the_kernel(tmp_path: Path, name: str):
    before, after = _run(tmp_path, True, name)
    assert before == (OLD, OLD, OLD)
    assert after == (OLD, OLD, OLD), f"{name} set a time of packfs's own: {after}"
