"""Zero-message open (option filecache, packfs/fuse/fuseshim.py) on a real mount.

The point is fewer FUSE requests: an open of an existing file sends no OPEN, its close no
RELEASE, and a file read again is still answered from the kernel's cache. The promise is that
nothing else changes: O_TRUNC still truncates, writes through such a handle are read
back at once and reach the log without a release, root's writes keep set-ID bits and
others' take them, and nofilecache brings the requests back.
"""
from __future__ import annotations

import os
import stat
import subprocess
import time

from fsutil import as_user, pages_pinned, read_file, write_file
from mounts import PACKFS, mounted, requests_received, requests_served, stats


def _grown(before: dict[str, int], after: dict[str, int], op: str) -> int:
    return after.get(op, 0) - before.get(op, 0)


def _swift_get(path) -> bytes:
    """What Swift's object server does for a GET: open, read the metadata xattrs, read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.getxattr(fd, "user.swift.metadata")
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _put(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.setxattr(fd, "user.swift.metadata", b"meta")
        os.fsync(fd)
    finally:
        os.close(fd)


def test_files_open_without_a_request_and_reads_are_cached(mnt):
    assert stats(mnt)["zero_message_open"] is True
    shown = subprocess.run([*PACKFS, "stats", str(mnt)], check=True, capture_output=True, text=True).stdout
    assert "files          open without a request" in shown
    data = os.urandom(10000)
    _put(mnt / "obj", data)
    before = requests_received(mnt)
    assert _swift_get(mnt / "obj") == data
    with open(mnt / "obj", "rb") as f, pages_pinned(f.fileno(), len(data)):
        middle = requests_received(mnt)
        for _ in range(5):
            assert _swift_get(mnt / "obj") == data
        after = requests_received(mnt)
    for op in ("open", "release"):
        assert _grown(before, after, op) == 0
    assert _grown(before, middle, "read") >= 1
    assert _grown(middle, after, "read") == 0  # five more reads, all from the kernel's cache
    assert _grown(middle, after, "getxattr") == 5  # xattrs are never cached by the kernel


def test_a_files_pages_stay_cached_when_its_own_writes_change_its_mtime(mnt):
    """A database written in place (SQLite's pwrite, fstat, pread) is read from the
    kernel's cache: packfs is the only writer, so the shim asks the kernel not to drop a
    file's pages whenever a GETATTR shows a new mtime (FUSE's AUTO_INVAL_DATA)."""
    write_file(mnt / "db", b"a" * 65536)
    fd = os.open(mnt / "db", os.O_RDWR)
    try:
        with pages_pinned(fd, 65536):  # now in the page cache, and not for reclaim to take
            model = bytearray(os.pread(fd, 65536, 0))
            mtimes = set()
            before = requests_received(mnt)
            for i in range(16):
                os.pwrite(fd, bytes([i]) * 4096, i * 4096)
                model[i * 4096:(i + 1) * 4096] = bytes([i]) * 4096
                mtimes.add(os.fstat(fd).st_mtime_ns)
                assert os.pread(fd, 65536, 0) == model
            after = requests_received(mnt)
    finally:
        os.close(fd)
    assert len(mtimes) > 1 and _grown(before, after, "getattr") >= 16
    assert _grown(before, after, "read") == 0
    assert read_file(mnt / "db") == model


def test_the_creating_handle_is_still_opened_and_released(mnt):
    before = requests_served(mnt)
    _put(mnt / "obj", b"x")
    after = requests_served(mnt)
    assert _grown(before, after, "create") == 1
    assert _grown(before, after, "release") == 1


def test_o_trunc_truncates_a_file_opened_without_a_request(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as m:
        write_file(m / "f", b"hello world")
        assert read_file(m / "f") == b"hello world"  # its pages are in the kernel's cache now
        before = requests_served(m)
        fd = os.open(m / "f", os.O_WRONLY | os.O_TRUNC)
        os.close(fd)
        assert _grown(before, requests_served(m), "setattr") == 1  # the kernel sends O_TRUNC so
        assert os.stat(m / "f").st_size == 0
        assert read_file(m / "f") == b""
        with open(m / "f", "wb") as f:
            f.write(b"ab")
        assert read_file(m / "f") == b"ab"
    with mounted(packdir, tmp_path / "mnt") as m:
        assert read_file(m / "f") == b"ab"


def test_writes_through_an_opened_file_are_read_back_and_kept(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as m:
        write_file(m / "hashes.invalid", b"")
        reader = os.open(m / "hashes.invalid", os.O_RDONLY)
        try:
            for suffix in (b"abc\n", b"def\n", b"012\n"):
                with open(m / "hashes.invalid", "ab") as f:  # Swift's invalidate_hash
                    f.write(suffix)
            assert os.pread(reader, 100, 0) == b"abc\ndef\n012\n"
        finally:
            os.close(reader)
        with open(m / "hashes.invalid", "r+b") as f:
            f.seek(4)
            f.write(b"DEF")
        # No release comes for such a handle: its run waits for the next commit, as any
        # file's, so that Swift's appends share the write of the PUT that made them.
        assert stats(m)["dirty_bytes"] > 0
        assert read_file(m / "hashes.invalid") == b"abc\nDEF\n012\n"
        write_file(m / "other", b"x", fsync=True)  # an fsync of any file commits every change before it
        assert stats(m)["dirty_bytes"] == 0
    with mounted(packdir, tmp_path / "mnt") as m:  # a clean unmount keeps them
        assert read_file(m / "hashes.invalid") == b"abc\nDEF\n012\n"


def test_set_id_bits_of_a_file_opened_without_a_request(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as m:
        for name in ("theirs", "root"):
            write_file(m / name, b"x")
            os.chmod(m / name, 0o6777)
        as_user(m, """
            with open("theirs", "r+b") as f:
                f.write(b"y")
        """)
        with open(m / "root", "r+b") as f:
            f.write(b"r")
        assert stat.S_IMODE(os.stat(m / "theirs").st_mode) == 0o777
        assert stat.S_IMODE(os.stat(m / "root").st_mode) == 0o6777


def test_nofilecache_opens_files_by_a_request(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt", "nofilecache") as m:
        assert stats(m)["zero_message_open"] is False
        _put(m / "obj", b"data")
        before = requests_served(m)
        assert _swift_get(m / "obj") == b"data"
        after = requests_served(m)
        assert _grown(before, after, "open") == 1
        assert _grown(before, after, "release") == 1


def test_an_unlinked_file_opened_without_a_request_lives_until_closed(mnt):
    """No release tells packfs the file is closed: the kernel's reference does (FORGET)."""
    (mnt / "f").write_bytes(b"x" * 100_000)
    fd = os.open(mnt / "f", os.O_RDWR)
    try:
        os.unlink(mnt / "f")
        os.pwrite(fd, b"y" * 50_000, 100_000)
        os.fsync(fd)
        assert os.fstat(fd).st_size == 150_000
        assert os.pread(fd, 150_000, 0) == b"x" * 100_000 + b"y" * 50_000
        assert stats(mnt)["files"] == 1
    finally:
        os.close(fd)
    deadline = time.monotonic() + 10
    while stats(mnt)["files"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel forgets the inode after the close, asynchronously
    assert stats(mnt)["files"] == 0
    assert stats(mnt)["live_bytes"] == 0


def test_created_files_are_not_held_once_closed_and_unlinked(mnt):
    """The kernel sends no RELEASE at all once it opens files without a request, not even
    for files create() opened: their handles name the inode, so a file that was written,
    closed and unlinked (Swift's DELETE and overwrite) leaves the table and its records go,
    and its xattrs are compressed without waiting for a close that never comes."""
    os.makedirs(mnt / "d")
    write_file(mnt / "d" / "first", b"x")
    read_file(mnt / "d" / "first")  # an open without a request: no RELEASE from here on
    base = stats(mnt)["inodes"]
    meta = b"{'X-Timestamp': '1700000000.00000', 'Content-Type': 'application/octet-stream'}" * 4
    before = requests_served(mnt)
    for i in range(30):
        fd = os.open(mnt / "d" / f"o{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"y" * 5000)
        os.setxattr(fd, "user.swift.metadata", meta)
        os.fsync(fd)
        os.close(fd)
    assert _grown(before, requests_served(mnt), "release") == 0
    assert stats(mnt)["inodes"] == base + 30
    for i in range(30):
        assert read_file(mnt / "d" / f"o{i}") == b"y" * 5000
        os.unlink(mnt / "d" / f"o{i}")
    s = stats(mnt)
    assert s["inodes"] == base and s["unlinked_in_use"] == {"open": 0, "kernel_only": 0}
    # The xattrs of the written, closed files were compressed (a plain one is ~340 B).
    for i in range(30, 40):
        write_file(mnt / "d" / f"o{i}", b"z")
        os.setxattr(mnt / "d" / f"o{i}", "user.swift.metadata", meta)
    deadline = time.monotonic() + 10
    while stats(mnt)["arena_bytes"]["xattrs"] - stats(mnt)["arena_free_bytes"]["xattrs"] > 10 * 200:
        assert time.monotonic() < deadline, "xattrs of closed files stay plain"
        write_file(mnt / "d" / "commit", b"c", fsync=True)  # each commit is a turn of the compressor
        time.sleep(0.05)
    # An open, unlinked file stays readable until it is closed, then goes.
    write_file(mnt / "d" / "held", b"h" * 100)
    fd = os.open(mnt / "d" / "held", os.O_RDONLY)
    os.unlink(mnt / "d" / "held")
    assert os.pread(fd, 100, 0) == b"h" * 100
    os.close(fd)
    deadline = time.monotonic() + 10
    while stats(mnt)["unlinked_in_use"] != {"open": 0, "kernel_only": 0}:
        assert time.monotonic() < deadline, "a closed, unlinked file is still held"
        time.sleep(0.1)
