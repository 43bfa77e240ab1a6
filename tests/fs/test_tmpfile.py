"""open(O_TMPFILE) and linkat: a file with no name, named once it is whole.

Swift writes each object that way where the filesystem lets it (`use_linkat`): the
object server opens its hash directory with O_TMPFILE, writes and fsyncs the file, then
links it into place with linkat(2) of /proc/self/fd/N and fsyncs the directory. The
fuse shim hands the kernel's TMPFILE request to packfs as a create of the name "/"
(fuseshim.py).
"""
from __future__ import annotations

import contextlib
import errno
import os
import time

import pytest

from fsutil import fsync_dir, link_fd, raises_errno, read_file
from mounts import kill9, mount, mounted, stats, umount


def test_a_tmpfile_has_no_name_until_linked(work):
    os.chmod(work, 0o2775)  # a set-group-ID directory: the file takes its group
    os.chown(work, -1, 1234)
    before = os.stat(work)
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o640)
    try:
        data = os.urandom(300_000)
        os.write(fd, data)
        st = os.fstat(fd)
        assert (st.st_nlink, st.st_size, st.st_gid, st.st_mode & 0o7777) == (0, len(data), 1234, 0o640)
        assert os.listdir(work) == []
        assert os.stat(work).st_mtime_ns == before.st_mtime_ns  # the directory did not change
        os.fsync(fd)
        link_fd(fd, work / "obj.data")
        assert os.fstat(fd).st_nlink == 1
        assert os.stat(work / "obj.data").st_ino == st.st_ino
        assert os.stat(work).st_mtime_ns > before.st_mtime_ns
        with raises_errno(errno.EEXIST):
            link_fd(fd, work / "obj.data")
        link_fd(fd, work / "second")  # named now: an ordinary hard link
        assert os.fstat(fd).st_nlink == 2
    finally:
        os.close(fd)
    assert read_file(work / "obj.data") == data


def test_a_tmpfile_never_linked_goes_with_its_data(work, shared_mount):
    _, m = shared_mount
    fd = os.open(work, os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.write(fd, b"x" * 200_000)
    os.fsync(fd)
    held = stats(m)["unlinked_in_use"]
    assert sum(held.values()) >= 1
    os.close(fd)
    deadline = time.monotonic() + 10  # the kernel's FORGET of the file follows the close
    while stats(m)["unlinked_in_use"] != {"open": 0, "kernel_only": 0}:
        assert time.monotonic() < deadline, stats(m)["unlinked_in_use"]
        time.sleep(0.05)
    assert os.listdir(work) == []


def test_an_exclusive_tmpfile_and_an_unlinked_file_cannot_be_named(work):
    fd = os.open(work, os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
    try:
        with raises_errno(errno.ENOENT):
            link_fd(fd, work / "never")
    finally:
        os.close(fd)
    with open(work / "f", "wb") as f:
        os.unlink(work / "f")
        with raises_errno(errno.ENOENT):
            link_fd(f.fileno(), work / "back")
    assert os.listdir(work) == []


def test_tmpfile_needs_a_directory(work):
    (work / "plain").write_bytes(b"")
    with raises_errno(errno.ENOTDIR):
        os.open(work / "plain", os.O_TMPFILE | os.O_WRONLY)


def test_a_linked_tmpfile_survives_a_crash_and_an_unlinked_one_does_not(tmp_path):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    data = os.urandom(100_000)
    with mounted(pack, mnt):
        os.mkdir(mnt / "d")
        fd = os.open(mnt / "d", os.O_TMPFILE | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        link_fd(fd, mnt / "d" / "kept")
        fsync_dir(mnt / "d")
        os.close(fd)
        orphan = os.open(mnt / "d", os.O_TMPFILE | os.O_WRONLY, 0o644)
        os.write(orphan, os.urandom(500_000))
        os.fsync(orphan)  # durable, with no name: the crash must take it
        kill9(pack, mnt)
        with contextlib.suppress(OSError):  # its connection is gone
            os.close(orphan)
    mount(pack, mnt)
    try:
        assert os.listdir(mnt / "d") == ["kept"]
        assert read_file(mnt / "d" / "kept") == data
        s = stats(mnt)
        assert s["files"] == 1
        assert s["unlinked_in_use"] == {"open": 0, "kernel_only": 0}
    finally:
        umount(pack, mnt)


@pytest.mark.parametrize("options", ["", "nofilecache"])
def test_only_the_fsync_that_names_a_tmpfile_waits_for_a_flush(tmp_path, options):
    """Swift fsyncs its nameless file, links it, then fsyncs the directory: the file's
    fsync commits nothing (no crash can leave a file with no name), and the directory's
    commit carries its data (Filesystem.fsync). A file unlinked while open still commits:
    its unlink may not be durable yet."""
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    data = os.urandom(150_000)
    # commit_interval=0: no commit nobody asked for
    with mounted(pack, mnt, ",".join(filter(None, [options, "commit_interval=0"]))) as m:
        os.mkdir(m / "d")
        fsync_dir(m / "d")
        commits = stats(m)["commits"]
        fd = os.open(m / "d", os.O_TMPFILE | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.fdatasync(fd)
        assert stats(m)["commits"] == commits
        link_fd(fd, m / "d" / "obj")
        fsync_dir(m / "d")
        assert stats(m)["commits"] == commits + 1
        os.write(fd, b"named now")
        os.fsync(fd)
        assert stats(m)["commits"] == commits + 2
        os.close(fd)
        with open(m / "d" / "gone", "wb") as f:
            f.write(b"x")
            os.unlink(m / "d" / "gone")
            os.fsync(f.fileno())
            assert stats(m)["commits"] == commits + 3
        kill9(pack, m)
    mount(pack, mnt)
    try:
        assert os.listdir(mnt / "d") == ["obj"]
        assert read_file(mnt / "d" / "obj") == data + b"named now"
    finally:
        umount(pack, mnt)


@pytest.mark.parametrize("options", ["notmpfile", "nofilecache"])
def test_the_option_turns_it_off_and_nofilecache_keeps_it(tmp_path, options):
    with mounted(tmp_path / "pack", tmp_path / "mnt", options) as m:
        if options == "notmpfile":
            with raises_errno(errno.EOPNOTSUPP):
                os.open(m, os.O_TMPFILE | os.O_WRONLY, 0o600)
            assert (stats(m)["tmpfiles"], stats(m)["o_tmpfile"]) == (0, False)
            return
        fd = os.open(m, os.O_TMPFILE | os.O_WRONLY, 0o600)  # a counted handle: release comes
        try:
            os.write(fd, b"abc")
            link_fd(fd, m / "named")
        finally:
            os.close(fd)
        assert read_file(m / "named") == b"abc"
        assert (stats(m)["tmpfiles"], stats(m)["o_tmpfile"]) == (1, True)
