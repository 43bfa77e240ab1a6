"""What writing, truncating and chowning a file takes from it (HANDLE_KILLPRIV_V2 leaves
it to packfs): set-ID bits by Linux's rules, and file capabilities, without FUSE."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from packfs.core import pack as packmod
from packfs.store.disk import Disk
from packfs.core.filesystem import Filesystem, Setattr
from packfs.namespace.namespace import CAPABILITY, ROOT, Namespace
from test_recovery import run

SETID_EXEC = stat.S_IFREG | 0o6755  # set-user-ID, set-group-ID, the group may execute
SETGID_NOEXEC = stat.S_IFREG | 0o2644  # set-group-ID alone: mandatory locking, not a privilege


@pytest.fixture
def ns() -> Namespace:
    return Namespace.fresh()


@pytest.fixture
def packdir(tmp_path: Path) -> Path:
    packmod.initialise(str(tmp_path / "pack"), Disk())
    return tmp_path / "pack"


def test_an_unprivileged_write_takes_both_set_id_bits_and_capabilities(ns):
    node = ns.create(ROOT, b"f", SETID_EXEC, 0, 0)
    ns.setxattr(node.ino, CAPABILITY, b"\x01" * 20)
    ns.setxattr(node.ino, b"user.kept", b"v")
    ns.take_journal_changes()
    ns.remove_privileges(node, setid=True)
    assert stat.S_IMODE(node.mode) == 0o755
    assert ns.listxattr(node.ino) == [b"user.kept"]
    assert node.ino in ns.take_journal_changes().inodes  # journaled like any change


def test_a_privileged_write_keeps_set_id_bits_but_not_capabilities(ns):
    node = ns.create(ROOT, b"f", SETID_EXEC, 0, 0)
    ns.setxattr(node.ino, CAPABILITY, b"\x01" * 20)
    ns.remove_privileges(node, setid=False)
    assert stat.S_IMODE(node.mode) == 0o6755
    assert ns.listxattr(node.ino) == []


def test_set_group_id_without_group_execute_stays(ns):
    node = ns.create(ROOT, b"f", SETGID_NOEXEC | stat.S_ISUID, 0, 0)
    ns.remove_privileges(node, setid=True)
    assert stat.S_IMODE(node.mode) == 0o2644


def test_nothing_to_take_changes_nothing(ns):
    node = ns.create(ROOT, b"f", stat.S_IFREG | 0o644, 0, 0)
    ctime = node.ctime
    ns.take_journal_changes()
    ns.remove_privileges(node, setid=True)
    assert node.ctime == ctime and not ns.take_journal_changes().inodes


def test_write_truncate_and_chown_through_the_filesystem(packdir):
    async def body(fs: Filesystem) -> None:
        def fresh(name: bytes) -> int:
            return fs.create(ROOT, name, SETID_EXEC, 0, 0).ino

        def mode(ino: int) -> int:
            return stat.S_IMODE(fs.getattr(ino).mode)

        a, b, c, d, e = (fresh(n) for n in (b"a", b"b", b"c", b"d", b"e"))
        fh = fs.open(a, privileged=False)
        await fs.write(fh, 0, b"x")
        await fs.release(fh)
        fh = fs.open(b, privileged=True)
        await fs.write(fh, 0, b"x")
        await fs.release(fh)
        assert (mode(a), mode(b)) == (0o755, 0o6755)
        await fs.setattr(c, Setattr(size=10), privileged=False)
        await fs.setattr(d, Setattr(uid=7), privileged=True)  # a chown takes them even from root
        await fs.release(fs.open(e, truncate=True, privileged=False))
        assert (mode(c), mode(d), mode(e)) == (0o755, 0o755, 0o755)
        await fs.setattr(b, Setattr(size=0), privileged=True)
        await fs.setattr(b, Setattr(atime=1), privileged=False)  # not a size or owner change
        assert mode(b) == 0o6755
    run(packdir, body, clean=True)


def test_a_chown_leaves_a_directory_alone(packdir):
    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", stat.S_IFDIR | 0o2775, 0, 0).ino
        await fs.setattr(d, Setattr(gid=5), privileged=False)
        assert stat.S_IMODE(fs.getattr(d).mode) == 0o2775
    run(packdir, body, clean=True)


def test_the_changes_survive_a_remount(packdir: Path):
    async def body(fs: Filesystem) -> None:
        ino = fs.create(ROOT, b"f", SETID_EXEC, 0, 0).ino
        fs.setxattr(ino, CAPABILITY, b"\x01" * 20)
        fh = fs.open(ino, privileged=False)
        await fs.write(fh, 0, b"x")
        await fs.release(fh)
        await fs.fsync()

    async def check(fs: Filesystem) -> None:
        node = fs.lookup(ROOT, b"f")
        assert stat.S_IMODE(node.mode) == 0o755 and await fs.listxattr(node.ino) == []
    run(packdir, body, clean=False)
    run(packdir, check, clean=True)
