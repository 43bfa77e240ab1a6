"""The atime rule of the core (Filesystem.accessed), without FUSE: the kernel's relatime,
strictatime and noatime, and reads that must leave atime alone (O_NOATIME)."""
from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
import trio
from started import with_filesystem

from packfs.core.filesystem import INODE_HANDLE, NOATIME_READER, RELATIME_NS, Filesystem, Setattr
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644
T = 1_700_000_000 * 10**9  # mtime and ctime of the file, in ns


def _atime_after_read(tmp_path: Path, mode: str, atime: int, noatime_open: bool = False,
                      by_inode: int = 0) -> tuple[int, bool]:
    """The file's atime after one read, from `atime` with mtime = ctime = T, and whether
    the read marked the inode changed for the next commit."""
    out: list[tuple[int, bool]] = []

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        node = fs.create(ROOT, b"f", REG, 0, 0)
        fh = fs.open(node.ino)
        await fs.write(fh, 0, b"x" * 100)
        await fs.release(fh)
        await fs.setattr(node.ino, Setattr(atime=atime, mtime=T, ctime=T))
        await fs.fsync()
        assert not fs.ns.journal_changes.inodes
        reader = INODE_HANDLE | by_inode | node.ino if by_inode else fs.open(node.ino, noatime=noatime_open)
        assert await fs.read(reader, 0, 100) == b"x" * 100
        out.append((fs.ns.get(node.ino).times()[0], node.ino in fs.ns.journal_changes.inodes))
        if not by_inode:
            await fs.release(reader)

    with_filesystem(tmp_path, body, atime=mode)
    return out[0]


@pytest.mark.parametrize("atime", [T - 1, T, T + 1])
def test_relatime_updates_an_atime_not_newer_than_mtime_and_ctime(tmp_path, atime):
    """(T + 1 is newer than both, but more than a day old by now: updated too.)"""
    got, changed = _atime_after_read(tmp_path, "relatime", atime)
    assert got > time.time_ns() - 10 * 10**9 and changed


def test_relatime_keeps_a_recent_atime_newer_than_mtime_and_ctime(tmp_path):
    recent = time.time_ns() - RELATIME_NS // 2

    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        node = fs.create(ROOT, b"f", REG, 0, 0)
        await fs.setattr(node.ino, Setattr(atime=recent, mtime=T, ctime=T))
        await fs.fsync()
        fs.accessed(node)
        assert node.times()[0] == recent
        assert node.ino not in fs.ns.journal_changes.inodes
        await fs.setattr(node.ino, Setattr(atime=time.time_ns() - RELATIME_NS - 10**9))
        await fs.fsync()
        fs.accessed(node)
        assert node.times()[0] > time.time_ns() - 10 * 10**9, "a day-old atime was kept"

    with_filesystem(tmp_path, body)


def test_strictatime_updates_a_recent_atime(tmp_path):
    recent = time.time_ns() - 10**9
    got, changed = _atime_after_read(tmp_path, "strictatime", recent)
    assert got > recent and changed


def test_noatime_never_updates(tmp_path):
    assert _atime_after_read(tmp_path, "noatime", T - 1) == (T - 1, False)


def test_reads_through_an_o_noatime_file_leave_atime_alone(tmp_path):
    assert _atime_after_read(tmp_path / "counted", "strictatime", T - 1, noatime_open=True) == (T - 1, False)
    assert _atime_after_read(tmp_path / "by_inode", "strictatime", T - 1, by_inode=NOATIME_READER) == (T - 1, False)
