"""direct_writes: the creating handle uses direct I/O, and so do write-only handles
where files are opened by a request (nofilecache).

The point is one FUSE request per write() and no copy into the page cache; the promise
is that nothing else changes: cached readers and mappings still see every write at once, and files
read back the same. MAP_SHARED on such a handle needs a kernel that lets the filesystem
allow it (6.6 and later); an older one answers ENODEV, as README's direct_writes says.
"""
from __future__ import annotations

import errno
import mmap
import os

import pytest

from fsutil import raises_errno, read_file, write_file
from mounts import mounted, requests_received, stats


def _writes_and_capability_probes(mnt, open_flags: int) -> tuple[int, int]:
    before = requests_received(mnt)
    fd = os.open(mnt / "f", open_flags, 0o644)
    try:
        for i in range(20):
            os.pwrite(fd, bytes([i]) * 65536, i * 65536)
    finally:
        os.close(fd)
    after = requests_received(mnt)
    return (after.get("write", 0) - before.get("write", 0),
            after.get("getxattr", 0) - before.get("getxattr", 0))


@pytest.mark.parametrize("how, options", [("create", ""), ("create", "nofilecache"),
                                          ("write-only", "nofilecache")])
def test_a_direct_handle_costs_one_request_per_write(tmp_path, packdir, how, options):
    with mounted(packdir, tmp_path / "mnt", options) as m:
        if how == "write-only":
            write_file(m / "f", b"")
        writes, probes = _writes_and_capability_probes(m, os.O_WRONLY | os.O_CREAT)
        assert writes == 20
        assert probes == 0
        assert read_file(m / "f") == b"".join(bytes([i]) * 65536 for i in range(20))


def test_a_write_only_handle_opened_without_a_request_is_cached(tmp_path, packdir):
    """With filecache the kernel opens an existing file without asking, so packfs cannot
    make the handle direct: each write() is still one request, and the kernel asks for
    the file's capabilities once (HANDLE_KILLPRIV_V2), not per write."""
    with mounted(packdir, tmp_path / "mnt") as m:
        if not stats(m)["zero_message_open"]:
            pytest.skip("the kernel cannot open files without a request")
        write_file(m / "f", b"")
        writes, probes = _writes_and_capability_probes(m, os.O_WRONLY)
        assert writes == 20
        assert probes == (1 if stats(m)["killpriv_v2"] else 20)
        assert read_file(m / "f") == b"".join(bytes([i]) * 65536 for i in range(20))


def test_without_direct_writes_the_kernel_probes_once_per_file(tmp_path, packdir):
    """The cached path asks getxattr("security.capability") before a write unless the
    filesystem takes set-ID bits and capabilities itself (HANDLE_KILLPRIV_V2, which the
    fuse shim asks for): then once per inode, the first time."""
    with mounted(packdir, tmp_path / "mnt", "nodirect_writes") as m:
        writes, probes = _writes_and_capability_probes(m, os.O_WRONLY | os.O_CREAT)
        assert writes == 20
        assert probes == (1 if stats(m)["killpriv_v2"] else 20)
        assert stats(m)["killpriv_v2"] == (tuple(map(int, os.uname().release.split(".")[:2])) >= (5, 12))


def test_cached_readers_and_mappings_see_direct_writes(work):
    write_file(work / "f", b"a" * 8192)
    r = os.open(work / "f", os.O_RDONLY)
    try:
        assert os.pread(r, 4, 0) == b"aaaa"  # now in the page cache
        with mmap.mmap(r, 8192, prot=mmap.PROT_READ) as m:
            assert m[4096:4100] == b"aaaa"
            w = os.open(work / "f", os.O_WRONLY)
            try:
                os.pwrite(w, b"bbbb", 0)
                assert os.pread(r, 4, 0) == b"bbbb"
                assert m[:4] == b"bbbb"
                os.pwrite(w, b"cccc", 4096)
                assert m[4096:4100] == b"cccc"
                assert os.pread(r, 4, 4096) == b"cccc"
            finally:
                os.close(w)
    finally:
        os.close(r)


def test_cached_readers_see_the_creating_handles_direct_writes(work):
    """The kernel drops the cached pages a direct write covers; nothing else tells a
    cached reader, since packfs asks the kernel not to drop a file's pages when its
    mtime changes (the fuse shim takes AUTO_INVAL_DATA out of the INIT answer)."""
    w = os.open(work / "f", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        os.pwrite(w, b"a" * 8192, 0)
        r = os.open(work / "f", os.O_RDONLY)
        try:
            assert os.pread(r, 8192, 0) == b"a" * 8192  # now in the page cache
            os.pwrite(w, b"bbbb", 4096)
            os.stat(work / "f")
            assert os.pread(r, 8192, 0) == b"a" * 4096 + b"bbbb" + b"a" * 4092
        finally:
            os.close(r)
    finally:
        os.close(w)


def test_the_creating_handle_maps_shared_where_the_kernel_allows_it(work):
    """Linux 6.6 and later let a direct I/O handle be mapped MAP_SHARED if the filesystem
    asks (DIRECT_IO_ALLOW_MMAP, which the fuse shim asks for): the mapping and the
    handle's direct writes then see each other. An older kernel answers ENODEV, as
    README's direct_writes says, and reopening the file is the way out there."""
    allowed = stats(work.parent)["direct_io_mmap"]
    assert allowed == (tuple(map(int, os.uname().release.split(".")[:2])) >= (6, 6))
    fd = os.open(work / "f", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.pwrite(fd, b"a" * 8192, 0)
        if not allowed:
            with raises_errno(errno.ENODEV):
                mmap.mmap(fd, 8192)
            return
        with mmap.mmap(fd, 8192) as m:
            assert m[:4] == b"aaaa"
            m[:2] = b"ok"
            m.flush()
            assert os.pread(fd, 4, 0) == b"okaa"  # the handle reads what the mapping wrote
            os.pwrite(fd, b"bbbb", 4096)  # and the mapping sees the handle's direct write
            assert m[4096:4100] == b"bbbb"
    finally:
        os.close(fd)
    assert read_file(work / "f") == b"okaa" + b"a" * 4092 + b"bbbb" + b"a" * 4092


def test_a_reopened_handle_maps_shared(work):
    write_file(work / "f", b"\0" * 4096)
    fd = os.open(work / "f", os.O_RDWR)
    try:
        with mmap.mmap(fd, 4096) as m:
            m[:2] = b"ok"
    finally:
        os.close(fd)
    assert read_file(work / "f")[:2] == b"ok"
