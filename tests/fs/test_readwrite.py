"""Reads and writes at any offset: sparse files, overwrites, truncate, O_APPEND."""
from __future__ import annotations

import os
import threading
import random

import pytest

from fsutil import drop_cache, fsync_dir, model_pwrite, read_file, write_file
from mounts import mounted, stats

MiB = 1 << 20


def pread_all(path) -> bytes:
    return read_file(path)


def test_small_write_read_back(work):
    write_file(work / "f", b"hello world")
    assert pread_all(work / "f") == b"hello world"
    assert os.stat(work / "f").st_size == 11


def test_sparse_write_at_10mib(work):
    p = work / "sparse"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        assert os.pwrite(fd, b"tail-data", 10 * MiB) == 9
        assert os.fstat(fd).st_size == 10 * MiB + 9
        # The hole reads as zeros, through this fd and others, before and after fsync.
        assert os.pread(fd, 4096, 0) == bytes(4096)
        assert os.pread(fd, 4096, 5 * MiB) == bytes(4096)
        os.fsync(fd)
    finally:
        os.close(fd)
    data = pread_all(p)
    assert len(data) == 10 * MiB + 9
    assert data[:10 * MiB] == bytes(10 * MiB)
    assert data[10 * MiB:] == b"tail-data"
    assert os.stat(p).st_size == 10 * MiB + 9


def test_sparse_holes_between_extents(work):
    p = work / "holes"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"A" * 1000, 0)
        os.pwrite(fd, b"B" * 1000, 3 * MiB)          # not contiguous: flushes the A run
        os.pwrite(fd, b"C" * 1000, 1 * MiB + 17)      # behind the B run
        os.fsync(fd)
        os.pwrite(fd, b"D" * 10, 2 * MiB)             # unflushed, between two records
    finally:
        os.close(fd)
    data = pread_all(p)
    expect = bytearray(3 * MiB + 1000)
    expect[0:1000] = b"A" * 1000
    expect[3 * MiB:] = b"B" * 1000
    expect[MiB + 17:MiB + 1017] = b"C" * 1000
    expect[2 * MiB:2 * MiB + 10] = b"D" * 10
    assert data == bytes(expect)


@pytest.mark.parametrize("synced", [True, False], ids=["fsynced", "unsynced"])
@pytest.mark.parametrize("size", [10_000, 3 * MiB + 123], ids=["small", "multi-chunk"])
def test_overwrite_middle(work, synced, size):
    p = work / "f"
    rnd = random.Random(size)
    original = bytearray(rnd.randbytes(size))
    write_file(p, bytes(original), fsync=synced)
    patch = rnd.randbytes(5000)
    off = size // 2 - 1234
    fd = os.open(p, os.O_RDWR)
    try:
        os.pwrite(fd, patch, off)
        original[off:off + len(patch)] = patch
        # Read back through the same fd before any flush or fsync...
        drop_cache(fd)
        assert os.pread(fd, size + 10, 0) == bytes(original)
        # ...and a second, small overwrite that straddles the first one.
        os.pwrite(fd, b"Z" * 100, off + 4950)
        original[off + 4950:off + 5050] = b"Z" * 100
        assert os.fstat(fd).st_size == size
        if synced:
            os.fsync(fd)
    finally:
        os.close(fd)
    assert pread_all(p) == bytes(original)
    assert os.stat(p).st_size == size


def test_overwrite_across_record_boundary(work):
    """An overwrite spanning two flushed records splits both; nothing else moves."""
    p = work / "f"
    a, b = b"a" * (MiB + 7), b"b" * (MiB + 11)
    write_file(p, a + b, fsync=True)
    fd = os.open(p, os.O_RDWR)
    try:
        os.pwrite(fd, b"X" * 300_000, MiB - 100_000)
        os.fsync(fd)
    finally:
        os.close(fd)
    expect = bytearray(a + b)
    expect[MiB - 100_000:MiB + 200_000] = b"X" * 300_000
    assert pread_all(p) == bytes(expect)


def test_truncate_up_reads_zeros(work):
    p = work / "f"
    write_file(p, b"abc", fsync=True)
    os.truncate(p, 100_000)
    assert os.stat(p).st_size == 100_000
    assert pread_all(p) == b"abc" + bytes(100_000 - 3)


@pytest.mark.parametrize("synced", [True, False], ids=["fsynced", "unsynced"])
def test_truncate_down_then_extend_has_no_stale_data(work, synced):
    p = work / "f"
    write_file(p, b"S" * 200_000, fsync=synced)
    os.truncate(p, 10)
    assert os.stat(p).st_size == 10
    assert pread_all(p) == b"S" * 10
    os.truncate(p, 200_000)
    data = pread_all(p)
    assert data[:10] == b"S" * 10
    assert data[10:] == bytes(200_000 - 10), "stale data came back after truncate down and up"


def test_ftruncate_on_open_fd_with_buffered_data_then_write_beyond(work):
    p = work / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"Q" * 50_000)                  # buffered, not flushed
        os.ftruncate(fd, 1000)
        os.pwrite(fd, b"end", 60_000)               # extends again past the old data
        assert os.fstat(fd).st_size == 60_003
        drop_cache(fd)
        got = os.pread(fd, 70_000, 0)
    finally:
        os.close(fd)
    assert got == b"Q" * 1000 + bytes(59_000) + b"end"
    assert pread_all(p) == got


def test_o_trunc_discards_old_contents(work):
    p = work / "f"
    write_file(p, b"old" * 10_000, fsync=True)
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.pwrite(fd, b"new", 20_000)
    finally:
        os.close(fd)
    assert pread_all(p) == bytes(20_000) + b"new"


def test_o_append_from_two_fds(work):
    p = work / "log"
    write_file(p, b"start\n", fsync=True)
    fd1 = os.open(p, os.O_WRONLY | os.O_APPEND)
    fd2 = os.open(p, os.O_WRONLY | os.O_APPEND)
    lines = []
    try:
        for i in range(200):
            fd = fd1 if i % 2 == 0 else fd2
            line = f"line {i} from fd{1 + i % 2}\n".encode()
            os.write(fd, line)
            lines.append(line)
            if i == 100:
                os.fsync(fd1)
        # pwrite ignores nothing here: O_APPEND always appends (Linux semantics).
        os.lseek(fd2, 0, os.SEEK_SET)
        os.write(fd2, b"last\n")
    finally:
        os.close(fd1)
        os.close(fd2)
    assert pread_all(p) == b"start\n" + b"".join(lines) + b"last\n"


def test_o_append_processes_interleaved_with_fsync(work):
    """Swift appends to hashes.invalid from several processes."""
    p = work / "hashes.invalid"
    write_file(p, b"")
    fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for _ in range(4)]
    try:
        for i in range(100):
            os.write(fds[i % 4], b"%04d\n" % i)
            if i % 10 == 0:
                os.fsync(fds[i % 4])
    finally:
        for fd in fds:
            os.close(fd)
    assert pread_all(p) == b"".join(b"%04d\n" % i for i in range(100))


def test_random_writes_match_a_model(work):
    """Random pwrites, truncates and reads against a bytearray model."""
    rnd = random.Random(1234)
    p = work / "model"
    model = bytearray()
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        for step in range(400):
            op = rnd.random()
            if op < 0.6:
                off = rnd.randrange(0, 2 * MiB)
                data = rnd.randbytes(rnd.choice([1, 100, 4096, 65536, 300_000]))
                os.pwrite(fd, data, off)
                model_pwrite(model, off, data)
            elif op < 0.7:
                size = rnd.randrange(0, 2 * MiB)
                os.ftruncate(fd, size)
                if size < len(model):
                    del model[size:]
                else:
                    model.extend(bytes(size - len(model)))
            elif op < 0.78:
                os.fsync(fd)
            else:
                off = rnd.randrange(0, 2 * MiB + 1000)
                n = rnd.randrange(0, 500_000)
                if rnd.random() < 0.5:
                    drop_cache(fd)
                assert os.pread(fd, n, off) == bytes(model[off:off + n]), f"step {step}"
            assert os.fstat(fd).st_size == len(model), f"step {step}"
    finally:
        os.close(fd)
    assert pread_all(p) == bytes(model)
    fsync_dir(work)


def test_concurrent_fsyncs_share_the_c_log_writers_flushes(tmp_path, packdir):
    """A mount writes its log with the C writer (packfs/store/_logwriter.c, built by make), and
    fsyncs from several threads at once are grouped: fewer device flushes than fsyncs."""
    with mounted(packdir, tmp_path / "mnt") as m:
        s0 = stats(m)
        assert s0["log_writer"] == "c"

        def writer(t: int) -> None:
            for i in range(40):
                write_file(m / f"t{t}-{i}", b"%d" % i * 3000, fsync=True)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        s1 = stats(m)
        fsyncs = s1["operations"]["fsync"]["count"] - s0["operations"].get("fsync", {"count": 0})["count"]
        assert fsyncs == 320
        assert s1["device_flushes"] - s0["device_flushes"] < fsyncs
        shared = s1["group_commit"]  # what the flushes shared, as `packfs stats` shows it
        assert 0 < shared["flushes"] <= s1["device_flushes"]  # a take may flush two volumes
        assert shared["commits_per_flush"]["p99"] >= 2 and shared["files_per_flush"]["p99"] >= 2
        assert shared["commits_per_flush"]["mean"] <= shared["commits_per_flush"]["p99"]
    with mounted(packdir, tmp_path / "mnt") as m:
        assert all((m / f"t{t}-{i}").read_bytes() == b"%d" % i * 3000 for t in range(8) for i in range(40))


def test_a_lone_fsync_commits_on_the_event_loop(tmp_path, packdir):
    """With nothing else in flight, an fsync's batch is written and flushed by the loop
    itself (Volumes.write_now), and what it wrote reads back after a remount."""
    with mounted(packdir, tmp_path / "mnt") as m:
        before = stats(m)["device_flushes_on_loop"]
        for i in range(5):
            write_file(m / f"f{i}", b"%d" % i * 5000, fsync=True)
        assert stats(m)["device_flushes_on_loop"] >= before + 5
    with mounted(packdir, tmp_path / "mnt") as m:
        assert [(m / f"f{i}").read_bytes() for i in range(5)] == [b"%d" % i * 5000 for i in range(5)]
