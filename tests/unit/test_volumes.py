"""The volume log without FUSE: background preallocation and warm reads on the loop."""
from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import trio

from packfs.store import records
from packfs.store.disk import Disk
from packfs.errors import FsError
from packfs.store.volumes import (CROWDED_HOLD, META_RESERVE, PREALLOC_AHEAD, PREALLOC_STEP, REZERO_GAP, STREAM_GAP,
                                  Volumes, volume_name)

PACK_ID = 7


def volumes(tmp_path, volume_size: int = 1 << 30, disk: Disk | None = None) -> Volumes:
    v = Volumes(disk or Disk(), str(tmp_path), PACK_ID, volume_size, cache_bytes=1 << 20)
    v.open_tail(1, 0, 1)
    return v


def serve(v: Volumes, body, preallocate: bool = True) -> None:
    """Run body with the appender (and the preallocator) running, then stop them."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(v.run)
            if preallocate:
                nursery.start_soon(v.run_preallocator)
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_preallocator_keeps_flushed_zeros_ahead_of_the_tail(tmp_path):
    v = volumes(tmp_path)
    payload = os.urandom(100_000)

    async def body() -> None:
        await v.ensure_space(records.footprint(len(payload)))  # as every writer does first
        vol, off, ticket = v.append(records.DATA, 5, 0, payload, sync=True)
        await v.wait_durable(ticket)
        while v.allocated - v.tail < PREALLOC_AHEAD:
            await trio.sleep(0.01)
        assert v.allocated - v.tail < PREALLOC_AHEAD + PREALLOC_STEP  # no more than asked for
        assert v.disk.size(v.fd(1)) == v.allocated
        assert await v.read(vol, off, len(payload), 5) == payload

    serve(v, body)
    with open(os.path.join(tmp_path, volume_name(1)), "rb") as f:
        f.seek(records.footprint(len(payload)))
        assert f.read(1 << 20) == bytes(1 << 20)  # prepared space is zeros: the log ends there
    v.close()


class CountingDisk(Disk):
    """The real disk, noting how space was prepared and when it was flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.allocations: list[tuple[float, int, bool]] = []  # (when, offset, zeros)

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        self.calls.append(("allocate", zeros))
        self.allocations.append((time.monotonic(), offset, zeros))
        super().allocate(fd, offset, length, zeros)

    def fdatasync(self, fd: int) -> None:
        self.calls.append(("fdatasync",))
        super().fdatasync(fd)


def test_a_writer_that_outran_the_zeros_gets_its_step_fallocated(tmp_path):
    disk = CountingDisk()
    v = volumes(tmp_path, disk=disk)
    payload = os.urandom(300_000)

    async def body() -> None:
        await v.ensure_space(records.footprint(len(payload)))
        assert disk.calls == [("allocate", False)]  # neither zeros nor a flush to wait for
        assert v.allocated == disk.size(v.fd(1)) >= records.footprint(len(payload)) + META_RESERVE
        vol, off, ticket = v.append(records.DATA, 5, 0, payload, sync=True)
        await v.wait_durable(ticket)
        assert await v.read(vol, off, len(payload), 5) == payload

    serve(v, body, preallocate=False)
    with open(os.path.join(tmp_path, volume_name(1)), "rb") as f:
        f.seek(records.footprint(len(payload)))
        assert f.read(1 << 20) == bytes(1 << 20)  # fallocated space reads as zeros: the log ends there
    v.close()


class RefusingDisk(Disk):
    """The real disk, on which no volume can grow: every allocation fails with `err`."""

    def __init__(self, err: int) -> None:
        super().__init__()
        self.err = err

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize("err, heard, breaks", [(errno.EROFS, errno.EIO, True), (errno.EIO, errno.EIO, True),
                                                (errno.ENOSPC, errno.ENOSPC, False)])
def test_a_volume_that_cannot_grow(tmp_path, err, heard, breaks):
    """A backing filesystem that fails or went read-only (ext4 aborted) under the mount
    breaks the log when a writer needs the volume to grow, as a failed write would: EIO
    now and for every later change. A full disk is ENOSPC, and the log stays whole."""
    v = volumes(tmp_path, disk=RefusingDisk(err))

    async def body() -> None:
        for _ in range(2):  # the writer that met it, and the next one
            with pytest.raises(FsError) as e:
                await v.ensure_space(records.footprint(10_000))
            assert e.value.errno == heard
        assert v.broken == (err if breaks else 0)

    serve(v, body, preallocate=False)
    v.close()


class SlowZerosDisk(Disk):
    """The real disk, whose zeros take `delay` seconds a piece (a slow-flush day), noting
    each allocation as (offset, length, zeros)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.allocations: list[tuple[int, int, bool]] = []
        self.zeroing = threading.Event()  # set while a piece of zeros is being written

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        self.allocations.append((offset, length, zeros))
        if zeros:
            self.zeroing.set()
            time.sleep(self.delay)
        super().allocate(fd, offset, length, zeros)
        self.zeroing.clear()


def test_a_writer_waits_for_one_piece_of_zeros_not_a_whole_step(tmp_path):
    disk = SlowZerosDisk(delay=0.5)  # a step of zeros is 4 pieces: 2 s
    v = volumes(tmp_path, disk=disk)
    waited: list[float] = []

    async def body() -> None:
        with trio.fail_after(20):  # fail, not hang, if the zeros never come
            await v.ensure_space(records.BLOCK)  # fallocated by the writer; the background follows
            while not disk.zeroing.is_set():
                await trio.sleep(0.01)
            t0 = time.monotonic()
            await v.ensure_space(v.allocated - v.tail)  # past what is prepared: the writer grows
            waited.append(time.monotonic() - t0)

    serve(v, body)
    v.close()
    assert waited[0] < 1.0  # the piece under way, not the 3 after it
    own = [a for a in disk.allocations if not a[2]]
    assert len(own) >= 2  # the writer's steps are fallocated, the first and the one it waited for


def test_zeros_resume_once_the_writers_fall_behind(tmp_path):
    disk = SlowZerosDisk(delay=0.3)
    v = volumes(tmp_path, disk=disk)

    async def body() -> None:
        with trio.fail_after(20):  # fail, not hang, if the zeros never come back
            await v.ensure_space(records.BLOCK)
            while not disk.zeroing.is_set():
                await trio.sleep(0.01)
            await v.ensure_space(v.allocated - v.tail)  # waits for the zeros: writers outrun them
            first_wait = len(disk.allocations)
            while not disk.zeroing.is_set():  # the background zero-fills again...
                await trio.sleep(0.01)
        later = disk.allocations[first_wait:]
        fallocated = [a for a in later if not a[2]]
        zeroed = [a for a in later if a[2]]
        assert fallocated and zeroed
        # ...fallocating while close to the tail, then zeros from STREAM_GAP ahead of it
        assert all(off - v.tail < STREAM_GAP for off, _, _ in fallocated)
        assert zeroed[0][0] - v.tail >= STREAM_GAP
        assert max(off for off, _, _ in fallocated) < zeroed[0][0]

    serve(v, body)
    v.close()


def test_while_commits_are_crowded_the_background_fallocates_then_zeros_again(tmp_path):
    """A commit that was not alone (writers sharing the flushes) turns the zeros off for
    CROWDED_HOLD: the steps prepared meanwhile are fallocated, and zeros go over them
    (while the hold lasts, only STREAM_GAP ahead of the tail), so that commits landing
    there flush data alone. Commits alone again, the next steps are zeros."""
    disk = CountingDisk()
    v = volumes(tmp_path, disk=disk)
    payload = os.urandom(2 * PREALLOC_STEP)

    async def used_two_steps() -> list[tuple[float, int, bool]]:
        """Append two steps' worth, let the background prepare what that used: its allocations."""
        before = len(disk.allocations)
        await v.ensure_space(records.footprint(len(payload)))
        _, _, ticket = v.append(records.DATA, 5, 0, payload, sync=True)
        await v.wait_durable(ticket)
        while not v.preallocator_idle:
            await trio.sleep(0.01)
        return disk.allocations[before:]

    async def body() -> None:
        with trio.fail_after(60):
            await v.ensure_space(records.BLOCK)  # the writer's step; the background prepares the rest
            while not v.preallocator_idle:
                await trio.sleep(0.01)
            v.note_commit(alone=True)
            assert any(zeros for _, _, zeros in await used_two_steps())
            v.note_commit(alone=False)
            hold_ends = time.monotonic() + CROWDED_HOLD
            crowded = await used_two_steps()
            assert not crowded[0][2]  # the first step prepared while crowded is fallocated
            assert all(off >= v.tail + STREAM_GAP for when, off, zeros in crowded if zeros and when < hold_ends)
            assert v.unwritten == [] or v.unwritten[-1][1] <= v.tail + REZERO_GAP
            assert disk.holes(v.fd(1), v.tail + REZERO_GAP, v.allocated) == []
            await trio.sleep(max(0.0, hold_ends - time.monotonic()))
            v.note_commit(alone=True)
            assert all(zeros for _, _, zeros in await used_two_steps())

    serve(v, body)


def test_fallocated_space_ahead_of_the_tail_gets_zeros_and_keeps_the_records(tmp_path):
    """Space a writer had fallocated (it outran the zeros) is found again at the next
    mount, and the background writes zeros over it (but next to the tail, where commits
    would wait for them) and never over a record appended meanwhile."""
    disk = CountingDisk()
    v = volumes(tmp_path, disk=disk)
    payload = os.urandom(100_000)

    async def fallocate_a_step() -> None:
        await v.ensure_space(records.footprint(len(payload)))  # the writer's step: fallocated
        vol, off, ticket = v.append(records.DATA, 5, 0, payload, sync=True)
        await v.wait_durable(ticket)

    serve(v, fallocate_a_step, preallocate=False)
    assert v.unwritten == [[0, v.allocated]]  # the record's blocks are written now all the same
    tail, allocated = v.tail, v.allocated
    v.close()

    v = volumes(tmp_path, disk=disk)  # a new mount finds the same space unwritten past the tail
    v.open_tail(1, tail, 2)
    assert v.allocated == allocated
    assert v.unwritten == [[tail, allocated]] == [list(h) for h in disk.holes(v.fd(1), tail, allocated)]
    written: list[tuple[int, int, int]] = []

    async def body() -> None:
        with trio.fail_after(60):
            while not v.preallocator_idle:
                for i in range(4):  # records appended while the zeros are written
                    await v.ensure_space(records.BLOCK)
                    written.append(v.append(records.DATA, 6, i * records.BLOCK, bytes([i]) * 1000, sync=True))
                await v.wait_durable(written[-1][2])
                await trio.sleep(0.01)
            assert disk.holes(v.fd(1), v.tail + REZERO_GAP, v.allocated) == []  # not next to the tail
            for i, (vol, off, _) in enumerate(written):
                assert await v.read(vol, off, 1000, 6) == bytes([i % 4]) * 1000

    serve(v, body)
    assert ("allocate", True) in disk.calls
    v.close()
