"""The thread that writes and flushes the volume log, off the event loop.

The event loop submits batches of operations in log order; the writer takes every batch
queued so far at once, executes them in order (contiguous writes to one file as one
write), and, if any of them asked for durability, ends the take with one fdatasync of
each file it wrote: fsyncs that queued up during a flush share the next one (group
commit), and no event-loop round trip sits between two takes. After each take it
signals an eventfd that the loop waits on, and `done()` gives one result per batch.

A batch is `(tag, ops, sync_fd)`: `ops` are `(fd, offset, data)` writes and `(fd, -1,
None)` flushes, which happen where they stand (the log flushes a volume before it writes
the next one); `sync_fd`, if not -1, is flushed at the end of the take with the files
written. The first error stops the writer for good: that batch and every later one
report it, and nothing more is written (Volumes then refuses writes, as ext4 does with
errors=remount-ro).

The writer is C (`_logwriter.c`) where it can be: a Python thread takes the GIL for
every step of a batch, and at Swift's 4 KiB PUTs at concurrency 16 it took it ~24 times
per PUT, each time from the event loop, which waited. `ThreadWriter` keeps the same
contract in Python, for a Disk whose writes and flushes must be called (the tests'
fault-injecting disk), or if the C part is not built.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from typing import Protocol

from .disk import Disk

try:
    from ._logwriter import Writer as _CWriter
except ImportError:  # not built: the Python thread does the same
    _CWriter = None

Op = tuple[int, int, "bytes | None"]
Result = tuple[int, int, int, int, int, int]  # (tag, errno, write_ns, flush_ns, writes, flushes)


class LogWriter(Protocol):
    kind: str  # "c" or "python"

    def submit(self, tag: int, ops: list[Op], sync_fd: int) -> None: ...

    def done(self) -> list[Result]: ...

    def run_now(self, ops: list[Op], sync_fd: int) -> tuple[int, int, int, int, int] | None:
        """Execute one batch in the calling thread if the writer has none in hand (submitted
        and not collected by done()); None otherwise."""

    def fileno(self) -> int: ...

    def close(self) -> None:
        """Finish the take in hand and stop; batches not taken are dropped unwritten."""


class CWriter:
    """The C writer: its thread never takes the GIL."""

    kind = "c"

    def __init__(self) -> None:
        w = self._w = _CWriter()
        self.submit, self.done, self.run_now, self.fileno, self.close = w.submit, w.done, w.run_now, w.fileno, w.close


class ThreadWriter:
    """The same contract in Python, through the Disk's own pwrite and fdatasync."""

    kind = "python"

    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self._cond = threading.Condition()
        self._queued: list[tuple[int, list[Op], int]] = []
        self._done: list[Result] = []
        self._in_hand = 0
        self._failed = 0
        self._stopping = False
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="packfs-appender", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._efd

    def submit(self, tag: int, ops: list[Op], sync_fd: int) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the writer is stopped")
            self._queued.append((tag, ops, sync_fd))
            self._in_hand += 1
            self._cond.notify()

    def done(self) -> list[Result]:
        try:
            if self._efd >= 0:
                os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._cond:
            out, self._done = self._done, []
            self._in_hand -= len(out)
        return out

    def run_now(self, ops: list[Op], sync_fd: int) -> tuple[int, int, int, int, int] | None:
        with self._cond:
            if self._in_hand or self._stopping:
                return None
            failed = self._failed
        err, counts = self._execute([(0, ops, sync_fd)], failed)
        with self._cond:
            self._failed = err
        return (err, *counts)

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            self._in_hand -= len(self._queued)
            self._queued = []
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                take, self._queued = self._queued, []
                failed = self._failed
            err, counts = self._execute(take, failed)
            results = self._results(take, err, counts)
            with self._cond:
                self._failed = err
                self._done.extend(results)
            os.eventfd_write(self._efd, 1)

    @staticmethod
    def _results(take: list[tuple[int, list[Op], int]], err: int, counts: list[int]) -> list[Result]:
        """One result per batch of a take, its timings and counts charged to the last."""
        results = [(tag, err, 0, 0, 0, 0) for tag, _, _ in take]
        results[-1] = (take[-1][0], err, *counts)
        return results

    def _execute(self, take: list[tuple[int, list[Op], int]], err: int) -> tuple[int, list[int]]:
        """Run a take as _logwriter.c's execute() does; (errno, [write_ns, flush_ns,
        writes, flushes])."""
        counts = [0, 0, 0, 0]
        disk = self.disk
        written: list[int] = []
        run: list = []  # fd, offset, end, parts

        def write_run() -> None:
            if run:
                fd, off, _, parts = run
                t0 = time.perf_counter_ns()
                disk.pwrite(fd, parts[0] if len(parts) == 1 else b"".join(parts), off)
                counts[0] += time.perf_counter_ns() - t0
                counts[2] += 1
                run.clear()

        def flush(fd: int) -> None:
            t0 = time.perf_counter_ns()
            disk.fdatasync(fd)
            counts[1] += time.perf_counter_ns() - t0
            counts[3] += 1

        if err:
            return err, counts
        try:
            sync_fds = [fd for _, _, fd in take if fd >= 0]
            for _, ops, _ in take:
                for fd, off, data in ops:
                    if off < 0:
                        write_run()
                        flush(fd)
                    elif run and run[0] == fd and run[2] == off:
                        run[2] += len(data)
                        run[3].append(data)
                    else:
                        write_run()
                        run.extend((fd, off, off + len(data), [data]))
                        if fd not in written:
                            written.append(fd)
            write_run()
            if sync_fds:
                for fd in dict.fromkeys(written + sync_fds):
                    flush(fd)
        except OSError as e:
            return e.errno or errno.EIO, counts
        return 0, counts


def writer_for(disk: Disk) -> LogWriter:
    """The C writer, unless the disk's writes or flushes must be called (a subclass that
    overrides them) or the C part is not built."""
    if _CWriter is not None and type(disk).pwrite is Disk.pwrite and type(disk).fdatasync is Disk.fdatasync:
        return CWriter()
    return ThreadWriter(disk)
