"""The passthrough option: the kernel writes files open(O_TMPFILE) makes to a staging file,
and packfs takes the bytes in before anyone could see the file otherwise (staging.py).

Each test mounts with `-o passthrough` and is skipped where the kernel did not take
FUSE_PASSTHROUGH (Linux 6.9 and later, as root). The tmpfile tests of test_tmpfile.py
that use the shared mount run here again, on a passthrough mount (`shared_mount` below).
"""
from __future__ import annotations

import contextlib
import errno
import os
import random
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from fsutil import fallocate, fsync_dir, link_fd, model_pwrite, raises_errno, read_file
from mounts import kill9, mount, mounted, stats, umount
from test_tmpfile import (  # noqa: F401  (run again here, on a passthrough mount)
    test_a_tmpfile_has_no_name_until_linked,
    test_a_tmpfile_never_linked_goes_with_its_data,
    test_an_exclusive_tmpfile_and_an_unlinked_file_cannot_be_named,
    test_tmpfile_needs_a_directory,
)

from packfs.core.filesystem import FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE
from packfs.options import OptionError, Options
from packfs.fuse.staging import POOL_MAX

CHUNK = 64 << 10  # what Swift writes at a time


def _skip_unless_active(m: Path) -> None:
    if not stats(m)["passthrough"]["active"]:
        pytest.skip("the kernel did not take FUSE_PASSTHROUGH (Linux 6.9 and later, as root)")


@pytest.fixture(scope="module")
def shared_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("passthrough")
    with mounted(base / "pack", base / "mnt", "passthrough") as m:
        _skip_unless_active(m)
        yield base / "pack", m


@pytest.fixture
def pt(shared_mount: tuple[Path, Path]) -> Path:
    return shared_mount[1]


def _wait_for(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _ended(m: Path) -> Callable[[], bool]:
    """Every staged file's close has been handled (inotify's notice comes after close())."""
    return lambda: stats(m)["passthrough"]["open"] == 0


def _writes(m: Path) -> int:
    return stats(m)["operations"].get("write", {}).get("count", 0)


def test_a_swift_put_sends_no_write_requests(work, pt):
    data = os.urandom(1 << 20)
    before, staged = _writes(pt), stats(pt)["passthrough"]["staged"]
    fd = os.open(work, os.O_TMPFILE | os.O_WRONLY, 0o644)
    try:
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, len(data))  # Swift's reservation
        for i in range(0, len(data), CHUNK):
            os.write(fd, data[i:i + CHUNK])
        os.fsync(fd)
        link_fd(fd, work / "obj.data")
    finally:
        os.close(fd)
    fsync_dir(work)
    assert read_file(work / "obj.data") == data
    assert _writes(pt) == before
    s = stats(pt)["passthrough"]
    assert s["staged"] == staged + 1
    _wait_for(_ended(pt), "the staging file was not given back after the close")


def test_what_is_written_after_the_link_is_taken_at_the_close(work, pt):
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"a" * 300_000)
        os.fsync(fd)
        link_fd(fd, work / "f")
        os.pwrite(fd, b"b" * 1000, 10)  # over bytes already taken
        os.write(fd, b"c" * 5000)  # and past them
        assert os.pread(fd, 1010, 0) == b"a" * 10 + b"b" * 1000  # the staged handle reads its own writes
    finally:
        os.close(fd)
    _wait_for(_ended(pt), "the close was not handled")
    assert read_file(work / "f") == b"a" * 10 + b"b" * 1000 + b"a" * (300_000 - 1010) + b"c" * 5000


def test_a_reader_shares_the_staged_file_and_a_second_writer_fails(work, pt):
    """While a file is open for passthrough the kernel allows another open of it only for
    passthrough on the same backing file (EIO otherwise), which packfs gives an open for
    reading: a Swift GET between its PUT's linkat and the PUT's close reads the object.
    An open for writing fails, as the kernel would fail it (documented with the option)."""
    before = stats(pt)["passthrough"]["shared"]
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"a" * 5000)
        link_fd(fd, work / "f")
        reader = os.open(work / "f", os.O_RDONLY)
        try:
            assert os.pread(reader, 10000, 0) == b"a" * 5000
            os.pwrite(fd, b"b" * 100, 0)
            assert os.pread(reader, 200, 0) == b"b" * 100 + b"a" * 100  # the same backing file
            with raises_errno(errno.EIO):
                os.open(work / "f", os.O_RDWR)
            with raises_errno(errno.EIO):
                os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
            with open(f"/proc/self/fd/{fd}", "rb") as again:
                assert again.read() == b"b" * 100 + b"a" * 4900
        finally:
            os.close(reader)
    finally:
        os.close(fd)
    _wait_for(_ended(pt), "the close was not handled")
    assert read_file(work / "f") == b"b" * 100 + b"a" * 4900
    assert stats(pt)["passthrough"]["shared"] - before == 2


def test_a_reader_outlasts_the_creator_and_ends_the_staging(work, pt):
    """After the creator's close, while a reader shares the backing file, the file is
    still open for passthrough: another reader shares it too, and once the last is
    released the staging ends; the file then opens as any other."""
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o644)
    data = os.urandom(300_000)
    try:
        os.write(fd, data)
        os.fsync(fd)
        link_fd(fd, work / "f")
        reader = os.open(work / "f", os.O_RDONLY)
    finally:
        os.close(fd)
    try:
        time.sleep(0.2)  # (the creator's close is handled by now, most likely; the second
        # reader must share in either order: test_staging.py covers the order itself)
        assert stats(pt)["passthrough"]["open"] == 1  # held for the reader
        with open(work / "f", "rb") as second:
            assert second.read() == data
        assert os.pread(reader, len(data) + 1, 0) == data
    finally:
        os.close(reader)
    _wait_for(_ended(pt), "the last reader's release did not end the staging")
    assert read_file(work / "f") == data
    with open(work / "f", "r+b") as f:  # no longer open for passthrough: writable again
        f.write(b"z")
    assert read_file(work / "f") == b"z" + data[1:]


def test_other_files_open_through_requests_answered_in_c(work, pt):
    """With passthrough the kernel must send OPEN (a file open for passthrough is opened
    again only through an OPEN's reply), so files do not open without a request; the fuse
    shim answers the OPEN and RELEASE of every other file in C, as the kernel would have
    opened it itself: they reach no handler, and the file's pages stay cached."""
    s = stats(pt)
    assert s["opens_in_shim"] is True and s["zero_message_open"] is False

    def counts() -> tuple[int, int, int, int, int]:
        s = stats(pt)
        ops = s["operations"]
        return (s["opens_answered_in_shim"], s["releases_answered_in_shim"],
                *(ops.get(op, {}).get("count", 0) for op in ("open", "release", "read")))

    first = counts()
    with open(work / "f", "wb") as f:  # a create: its RELEASE is answered in C too
        f.write(b"x" * 10000)
    created = counts()
    for _ in range(3):
        with open(work / "f", "rb") as f:
            assert f.read() == b"x" * 10000
    after = counts()
    assert created[1] - first[1] == 1 and created[2:4] == first[2:4]
    assert after[0] - created[0] == 3 and after[1] - created[1] == 3  # three opens, three releases
    assert after[2:4] == created[2:4]  # none reached a handler
    assert after[4] - created[4] <= 1  # read once at most (the create's writes may have cached it)


def test_truncate_and_punch_through_the_staged_handle(work, pt):
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o644)
    try:
        os.write(fd, os.urandom(3 * CHUNK))
        os.ftruncate(fd, 1000)
        assert os.fstat(fd).st_size == 1000
        assert len(os.pread(fd, 5000, 0)) == 1000
        os.ftruncate(fd, 4 * CHUNK)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)
        assert os.pread(fd, 4096, 0) == bytes(4096)
        expected = os.pread(fd, 4 * CHUNK, 0)
        assert expected[1000:] == bytes(4 * CHUNK - 1000)
        link_fd(fd, work / "f")
    finally:
        os.close(fd)
    _wait_for(_ended(pt), "the close was not handled")
    assert read_file(work / "f") == expected


def test_random_writes_through_a_staged_handle_match_a_model(work, pt):
    rng = random.Random(5)
    model = bytearray()
    fd = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o644)
    try:
        for step in range(300):
            op = rng.random()
            if op < 0.7:
                offset = rng.randrange(0, len(model) + 3 * CHUNK)
                data = rng.randbytes(rng.choice([1, 100, 4096, CHUNK, 3 * CHUNK + 17]))
                os.pwrite(fd, data, offset)
                model_pwrite(model, offset, data)
            elif op < 0.8:
                size = rng.randrange(0, len(model) + 1)
                os.ftruncate(fd, size)
                del model[size:]
            elif op < 0.9:
                os.fsync(fd)
            else:
                assert os.fstat(fd).st_size == len(model)
            if step == 150:
                link_fd(fd, work / "f")
        assert os.pread(fd, len(model) + 1, 0) == model
        os.fsync(fd)
        fsync_dir(work)
    finally:
        os.close(fd)
    _wait_for(_ended(pt), "the close was not handled")
    assert read_file(work / "f") == model


def test_an_fsynced_staged_file_survives_a_crash(tmp_path):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    first, second = os.urandom(5 * (1 << 20) + 123), os.urandom(CHUNK)
    with mounted(pack, mnt, "passthrough") as m:
        _skip_unless_active(m)
        os.mkdir(m / "d")
        fd = os.open(m / "d", os.O_TMPFILE | os.O_WRONLY, 0o644)
        for i in range(0, len(first), CHUNK):
            os.write(fd, first[i:i + CHUNK])
        os.fsync(fd)
        os.pwrite(fd, second, 0)  # over the front, then fsynced again: taken by comparing chunks
        os.fsync(fd)
        link_fd(fd, m / "d" / "obj")
        fsync_dir(m / "d")
        os.write(fd, b"not synced")
        kill9(pack, m)
        with contextlib.suppress(OSError):  # its connection is gone
            os.close(fd)
    mount(pack, mnt)
    try:
        got = read_file(mnt / "d" / "obj")
        synced = second + first[len(second):]
        assert got[:len(synced)] == synced
        assert got[len(synced):] in (b"", b"not synced")
    finally:
        umount(pack, mnt)


def test_the_unmount_takes_what_an_open_staged_file_holds(tmp_path):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    data = os.urandom(2 * CHUNK)
    with mounted(pack, mnt, "passthrough") as m:
        _skip_unless_active(m)
        fd = os.open(m, os.O_TMPFILE | os.O_WRONLY, 0o644)
        os.write(fd, data)
        link_fd(fd, m / "f")
        os.write(fd, b"tail")
        os.close(fd)
        umount(pack, m)
    mount(pack, mnt)
    try:
        assert read_file(mnt / "f") == data + b"tail"
        assert stats(mnt)["passthrough"] == {"active": False}  # mounted without the option
    finally:
        umount(pack, mnt)


def test_staging_files_do_not_outlive_their_files(work, shared_mount):
    """Once its file is closed, a staging file is emptied and kept for a later create, up
    to POOL_MAX of them."""
    pack, m = shared_mount
    pid = int((pack / "daemon.pid").read_text())
    held = []
    for _ in range(POOL_MAX + 10):  # all open at once: as many staging files
        fd = os.open(work, os.O_TMPFILE | os.O_WRONLY, 0o644)
        os.write(fd, b"x" * 10_000)
        held.append(fd)
    for fd in held:
        os.close(fd)
    _wait_for(_ended(m), "staging files were kept after their files were closed")
    staging = [f"/proc/{pid}/fd/{n}" for n in os.listdir(f"/proc/{pid}/fd")
               if os.readlink(f"/proc/{pid}/fd/{n}").startswith(str(pack) + "/#")]
    assert 0 < len(staging) <= POOL_MAX
    assert [os.stat(p).st_size for p in staging] == [0] * len(staging)
    assert os.listdir(work) == []


def test_the_option_needs_tmpfile_and_excludes_the_writeback_cache():
    assert Options.parse("passthrough").passthrough
    with pytest.raises(OptionError, match="tmpfile"):
        Options.parse("passthrough,notmpfile")
    with pytest.raises(OptionError, match="writeback_cache"):
        Options.parse("passthrough,writeback_cache")


def test_without_the_option_nothing_is_staged(mnt):
    fd = os.open(mnt, os.O_TMPFILE | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x" * CHUNK)
    finally:
        os.close(fd)
    s = stats(mnt)
    assert s["passthrough"] == {"active": False}
    assert s["operations"]["write"]["count"] == 1


def test_a_tmpfile_in_a_directory_removed_meanwhile_still_stages(work, pt):
    os.mkdir(work / "d")
    fd = os.open(work / "d", os.O_TMPFILE | os.O_WRONLY, 0o644)
    try:
        os.rmdir(work / "d")
        os.write(fd, b"x" * CHUNK)
        os.fsync(fd)
        with raises_errno(errno.ENOENT):
            link_fd(fd, work / "d" / "f")
    finally:
        os.close(fd)
    _wait_for(_ended(pt), "the close was not handled")
