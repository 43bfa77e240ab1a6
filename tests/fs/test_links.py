"""Hard links and symbolic links."""
from __future__ import annotations

import errno
import os
import stat

from fsutil import raises_errno, read_file, write_file


def test_hardlink_nlink_and_shared_contents(work):
    write_file(work / "a", b"original", fsync=True)
    os.link(work / "a", work / "b")
    os.makedirs(work / "sub")
    os.link(work / "a", work / "sub" / "c")  # across directories, as the relinker does
    sa, sb, sc = (os.stat(work / n) for n in ("a", "b", "sub/c"))
    assert sa.st_ino == sb.st_ino == sc.st_ino
    assert sa.st_nlink == sb.st_nlink == sc.st_nlink == 3
    # A write through one name is seen through the others.
    with open(work / "b", "r+b") as f:
        f.seek(0)
        f.write(b"CHANGED!")
    assert read_file(work / "a") == b"CHANGED!"
    assert read_file(work / "sub" / "c") == b"CHANGED!"
    # Attributes are shared too.
    os.chmod(work / "a", 0o600)
    assert stat.S_IMODE(os.stat(work / "sub" / "c").st_mode) == 0o600


def test_hardlink_unlink_one_name(work):
    data = os.urandom(200_000)
    write_file(work / "a", data, fsync=True)
    os.link(work / "a", work / "b")
    os.unlink(work / "a")
    assert os.stat(work / "b").st_nlink == 1
    assert read_file(work / "b") == data
    assert os.listdir(work) == ["b"]
    os.unlink(work / "b")
    assert os.listdir(work) == []


def test_hardlink_ctime_changes(work):
    write_file(work / "a", b"")
    os.utime(work / "a", ns=(1_000_000_000, 1_000_000_000))
    before = os.stat(work / "a")
    os.link(work / "a", work / "b")
    after = os.stat(work / "a")
    assert after.st_ctime_ns > before.st_ctime_ns
    assert after.st_mtime_ns == before.st_mtime_ns


def test_hardlink_errors(work):
    os.makedirs(work / "d")
    write_file(work / "f", b"")
    write_file(work / "g", b"")
    with raises_errno(errno.EPERM):
        os.link(work / "d", work / "dlink")
    with raises_errno(errno.EEXIST):
        os.link(work / "f", work / "g")
    with raises_errno(errno.ENOENT):
        os.link(work / "missing", work / "x")


def test_symlink_readlink_lstat_follow(work):
    write_file(work / "target", b"through the link")
    os.symlink("target", work / "rel")
    os.symlink(str(work / "target"), work / "abs")
    assert os.readlink(work / "rel") == "target"
    assert os.readlink(work / "abs") == str(work / "target")
    st = os.lstat(work / "rel")
    assert stat.S_ISLNK(st.st_mode)
    assert st.st_size == len("target")
    assert os.stat(work / "rel").st_ino == os.stat(work / "target").st_ino
    assert read_file(work / "rel") == b"through the link"
    assert read_file(work / "abs") == b"through the link"
    # Writes through the link go to the target.
    with open(work / "rel", "ab") as f:
        f.write(b"!")
    assert read_file(work / "target") == b"through the link!"


def test_symlink_dangling_and_loops(work):
    os.symlink("nowhere", work / "dangling")
    assert os.path.lexists(work / "dangling")
    with raises_errno(errno.ENOENT):
        os.stat(work / "dangling")
    os.symlink("loop2", work / "loop1")
    os.symlink("loop1", work / "loop2")
    with raises_errno(errno.ELOOP):
        os.stat(work / "loop1")
    with raises_errno(errno.EEXIST):
        os.symlink("x", work / "dangling")
    write_file(work / "plain", b"")
    with raises_errno(errno.EINVAL):
        os.readlink(work / "plain")


def test_symlink_to_directory_and_unlink(work):
    os.makedirs(work / "d")
    write_file(work / "d" / "f", b"in d")
    os.symlink("d", work / "dl")
    assert read_file(work / "dl" / "f") == b"in d"
    assert sorted(os.listdir(work / "dl")) == ["f"]
    os.unlink(work / "dl")  # removes the link, not the directory
    assert os.path.isdir(work / "d")
    assert read_file(work / "d" / "f") == b"in d"


def test_symlink_long_target(work):
    target = "t" * 4000
    os.symlink(target, work / "long")
    assert os.readlink(work / "long") == target
    assert os.lstat(work / "long").st_size == 4000


def test_hardlink_to_symlink(work):
    os.symlink("target", work / "sl")
    os.link(work / "sl", work / "sl2", follow_symlinks=False)
    assert os.readlink(work / "sl2") == "target"
    assert os.lstat(work / "sl").st_nlink == 2
