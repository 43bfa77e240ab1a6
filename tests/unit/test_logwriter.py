"""The log writer's contract (packfs/store/logwriter.py), for the C writer and the Python one.

What the C writer's syscalls do is seen in the files they leave and in the errors they
report; the Python writer goes through a Disk, so a recording one shows its flushes too.
"""
from __future__ import annotations

import errno
import os
import select
import threading
import time
from pathlib import Path

import pytest

from packfs.store import logwriter
from packfs.store.disk import Disk


class RecordingDisk(Disk):
    """The real disk, noting each write and flush, and able to hold a flush until released."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.hold = threading.Event()
        self.hold.set()

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        super().pwrite(fd, data, offset)
        self.calls.append(("pwrite", fd, offset, len(data)))

    def fdatasync(self, fd: int) -> None:
        self.hold.wait()
        super().fdatasync(fd)
        self.calls.append(("fdatasync", fd))


def make(kind: str, disk: Disk | None = None) -> logwriter.LogWriter:
    if kind == "c":
        assert logwriter._CWriter is not None, "packfs/store/_logwriter.c is not built"
        return logwriter.CWriter()
    return logwriter.ThreadWriter(disk or Disk())


def wait_done(w: logwriter.LogWriter, count: int) -> list[tuple]:
    out: list[tuple] = []
    deadline = time.monotonic() + 10
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {out} done"
        select.select([w.fileno()], [], [], 0.5)
        out += w.done()
    return out


@pytest.fixture(params=["c", "python"])
def writer(request):
    """Each writer in turn, closed after the test (closing twice is harmless)."""
    w = make(request.param)
    yield w
    w.close()


@pytest.fixture
def files(tmp_path: Path):
    fds = [os.open(tmp_path / f"v{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(2)]
    yield fds
    for fd in fds:
        os.close(fd)


def test_batches_are_written_in_order_and_reported_by_tag(writer, files):
    a, b = files
    writer.submit(1, [(a, 0, b"x" * 10), (a, 10, memoryview(b"y" * 5))], -1)
    writer.submit(2, [(a, 5, b"z" * 3), (a, -1, None), (b, 100, b"w")], b)
    results = wait_done(writer, 2)
    assert [r[0] for r in results] == [1, 2]
    assert all(r[1] == 0 for r in results)
    assert sum(r[5] for r in results) >= 2  # the flush in place and the one at the end
    assert os.pread(a, 100, 0) == b"xxxxxzzzxxyyyyy"  # the later write over the earlier
    assert os.pread(b, 200, 0) == bytes(100) + b"w"


def test_python_writer_flushes_where_asked_and_once_per_take(files):
    disk = RecordingDisk()
    fd = files[0]
    disk.hold.clear()  # the first take's flush waits: the next three queue up behind it
    w = make("python", disk)
    w.submit(1, [(fd, 0, b"a")], fd)
    deadline = time.monotonic() + 10
    while not disk.calls:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    w.submit(2, [(fd, 1, b"b")], fd)
    w.submit(3, [(fd, 2, b"c"), (fd, -1, None), (fd, 3, b"d")], -1)
    w.submit(4, [], fd)
    disk.hold.set()
    assert [r[0] for r in wait_done(w, 4)] == [1, 2, 3, 4]
    w.close()
    assert disk.calls == [
        ("pwrite", fd, 0, 1), ("fdatasync", fd),  # take 1
        ("pwrite", fd, 1, 2), ("fdatasync", fd),  # take 2-4: "b" and "c" contiguous, one write; the flush in place
        ("pwrite", fd, 3, 1), ("fdatasync", fd),  # and one flush at the end for the three
    ]


def test_the_first_error_fails_that_batch_and_every_later_one(writer, files):
    a, _ = files
    writer.submit(1, [(a, 0, b"ok")], a)
    assert wait_done(writer, 1)[0][1] == 0
    writer.submit(2, [(a, 2, b"no"), (987654, 0, b"bad fd")], -1)
    writer.submit(3, [(a, 4, b"never")], a)
    results = wait_done(writer, 2)
    assert [(r[0], r[1]) for r in results] == [(2, errno.EBADF), (3, errno.EBADF)]
    writer.submit(4, [(a, 9, b"never")], a)
    assert wait_done(writer, 1)[0][1] == errno.EBADF
    assert writer.run_now([(a, 9, b"never")], a)[0] == errno.EBADF
    assert os.pread(a, 100, 0) == b"okno"


def test_run_now_writes_in_the_caller_only_when_nothing_is_in_hand(writer, files):
    a, _ = files
    err, write_ns, flush_ns, writes, flushes = writer.run_now([(a, 0, b"now")], a)
    assert (err, writes, flushes) == (0, 1, 1)
    assert os.pread(a, 10, 0) == b"now"
    writer.submit(1, [(a, 3, b"later")], a)
    assert writer.run_now([(a, 8, b"not")], a) is None  # in hand until done() collects it
    wait_done(writer, 1)
    assert writer.run_now([(a, 8, b"!")], -1)[0] == 0
    assert os.pread(a, 10, 0) == b"nowlater!"


def test_close_finishes_the_take_in_hand_and_refuses_more(writer, files):
    a, _ = files
    writer.submit(1, [(a, 0, b"x" * 4096)], a)
    writer.close()
    done = writer.done()
    assert [r[0] for r in done] in ([1], [])  # taken (and written) or dropped unwritten
    assert os.pread(a, 5000, 0) == (b"x" * 4096 if done else b"")
    with pytest.raises(RuntimeError):
        writer.submit(2, [], -1)


def test_a_disk_that_intercepts_writes_gets_the_python_writer():
    class Intercepting(Disk):
        def fdatasync(self, fd: int) -> None:
            super().fdatasync(fd)

    w = logwriter.writer_for(Intercepting())
    assert isinstance(w, logwriter.ThreadWriter)
    w.close()
    w = logwriter.writer_for(Disk())
    assert isinstance(w, logwriter.CWriter)  # built with the package (make test builds it)
    w.close()


@pytest.mark.parametrize("writer", ["c"], indirect=True)  # the Python writer takes what it is given
def test_malformed_ops_are_refused_and_the_writer_goes_on(writer, files):
    a, _ = files
    for bad in ([(a, 0)], [(a, 0, 123)], [(a, 0, b"ok"), ("fd", 2, b"x")]):
        with pytest.raises(TypeError):
            writer.submit(1, bad, -1)
        with pytest.raises(TypeError):
            writer.run_now(bad, -1)
    writer.submit(2, [(a, 0, b"fine")], a)
    assert [(r[0], r[1]) for r in wait_done(writer, 1)] == [(2, 0)]
    assert os.pread(a, 10, 0) == b"fine"
