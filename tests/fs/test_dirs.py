"""mkdir, rmdir, listings, directory link counts, and unlink of open files."""
from __future__ import annotations

import errno
import os
import stat

from fsutil import raises_errno, read_file, write_file


def test_mkdir_and_eexist(work):
    os.mkdir(work / "d", 0o750)
    st = os.stat(work / "d")
    assert stat.S_ISDIR(st.st_mode)
    assert st.st_nlink == 2
    with raises_errno(errno.EEXIST):
        os.mkdir(work / "d")
    write_file(work / "f", b"")
    with raises_errno(errno.EEXIST):
        os.mkdir(work / "f")
    os.symlink("d", work / "l")
    with raises_errno(errno.EEXIST):
        os.mkdir(work / "l")


def test_mkdir_in_missing_or_file_parent(work):
    with raises_errno(errno.ENOENT):
        os.mkdir(work / "missing" / "d")
    write_file(work / "f", b"")
    with raises_errno(errno.ENOTDIR):
        os.mkdir(work / "f" / "d")


def test_rmdir_errors(work):
    os.makedirs(work / "full" / "sub")
    write_file(work / "file", b"x")
    with raises_errno(errno.ENOTEMPTY):
        os.rmdir(work / "full")
    with raises_errno(errno.ENOTDIR):
        os.rmdir(work / "file")
    with raises_errno(errno.ENOENT):
        os.rmdir(work / "missing")
    with raises_errno(errno.ENOTDIR):
        os.rmdir(work / "file" / "x")
    with raises_errno(errno.EINVAL):
        os.rmdir(os.path.join(work, "full", "sub", "."))  # pathlib would drop the "."
    # A directory holding only a file is not empty either.
    os.mkdir(work / "withfile")
    write_file(work / "withfile" / "f", b"")
    with raises_errno(errno.ENOTEMPTY):
        os.rmdir(work / "withfile")
    os.unlink(work / "withfile" / "f")
    os.rmdir(work / "withfile")
    os.rmdir(work / "full" / "sub")
    os.rmdir(work / "full")
    assert os.listdir(work) == ["file"]


def test_unlink_errors(work):
    os.mkdir(work / "d")
    with raises_errno(errno.EISDIR):
        os.unlink(work / "d")
    with raises_errno(errno.ENOENT):
        os.unlink(work / "missing")


def test_directory_nlink_counts(work):
    assert os.stat(work).st_nlink == 2
    for i in range(5):
        os.mkdir(work / f"sub{i}")
    write_file(work / "file", b"")  # files do not count
    assert os.stat(work).st_nlink == 7
    os.mkdir(work / "sub0" / "deeper")
    assert os.stat(work / "sub0").st_nlink == 3
    assert os.stat(work).st_nlink == 7
    os.rmdir(work / "sub0" / "deeper")
    assert os.stat(work / "sub0").st_nlink == 2
    for i in range(5):
        os.rmdir(work / f"sub{i}")
    assert os.stat(work).st_nlink == 2


def test_rmdir_open_directory_then_use_it(work):
    os.mkdir(work / "d")
    fd = os.open(work / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(work / "d")
        # A removed directory accepts no new entries and lists as empty.
        with raises_errno(errno.ENOENT):
            os.open("new", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        with raises_errno(errno.ENOENT):
            os.mkdir("new", dir_fd=fd)
        assert os.listdir(fd) == []
        # Like ext4/XFS: the open directory can still be stat'ed, with no links left.
        st = os.fstat(fd)
        assert stat.S_ISDIR(st.st_mode) and st.st_nlink == 0
    finally:
        os.close(fd)
    assert not (work / "d").exists()


def test_listdir_many_entries(work):
    names = {f"entry-{i:05d}" for i in range(3000)}
    for n in names:
        write_file(work / n, b"")
    assert set(os.listdir(work)) == names
    with os.scandir(work) as it:
        seen = {e.name: e.is_file() for e in it}
    assert set(seen) == names and all(seen.values())
    for n in list(names)[:1000]:
        os.unlink(work / n)
        names.discard(n)
    assert set(os.listdir(work)) == names


def test_readdir_survives_removal_during_iteration(work):
    for i in range(500):
        write_file(work / f"f{i}", b"")
    seen = []
    with os.scandir(work) as it:
        for entry in it:
            seen.append(entry.name)
            if len(seen) == 10:
                for i in range(250, 500):
                    os.unlink(work / f"f{i}")
    assert set(seen) >= {f"f{i}" for i in range(250)}
    assert len(seen) == len(set(seen))


def test_dotdot_points_to_parent(work):
    os.makedirs(work / "a" / "b")
    assert os.stat(work / "a" / "b" / "..").st_ino == os.stat(work / "a").st_ino
    assert os.stat(work / "a" / ".").st_ino == os.stat(work / "a").st_ino


def test_unlink_open_file_keeps_data_until_last_close(work):
    p = work / "victim"
    data = os.urandom(300_000)
    write_file(p, data, fsync=True)
    fd1 = os.open(p, os.O_RDONLY)
    fd2 = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not p.exists()
        assert os.listdir(work) == []
        assert os.fstat(fd1).st_nlink == 0
        assert os.fstat(fd1).st_size == len(data)
        os.posix_fadvise(fd1, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd1, len(data) + 1, 0) == data
        # Still writable through an open fd; the other fd sees it.
        os.pwrite(fd2, b"more", len(data))
        os.fsync(fd2)
        os.close(fd2)
        fd2 = -1
        os.posix_fadvise(fd1, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd1, len(data) + 10, 0) == data + b"more"
        assert os.fstat(fd1).st_nlink == 0
        # A new file under the old name is a different inode.
        write_file(p, b"new")
        assert os.stat(p).st_ino != os.fstat(fd1).st_ino
        assert read_file(p) == b"new"
    finally:
        os.close(fd1)
        if fd2 >= 0:
            os.close(fd2)


def test_unlink_open_file_with_unflushed_data(work):
    p = work / "tmpfile"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.write(fd, b"x" * 100_000)  # still in packfs's write-behind buffer
        os.unlink(p)
        assert os.fstat(fd).st_nlink == 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, 200_000, 0) == b"x" * 100_000
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.listdir(work) == []
