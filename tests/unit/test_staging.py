"""Staging without FUSE: the kernel's side is played by a second descriptor on the staging
file (as the kernel's backing file is: its writes and its close reach inotify), the store by
a file model that records every write it is given."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Awaitable, Callable

import pytest
import trio

from packfs.store.disk import Disk
from packfs.fuse.staging import CHUNKS_AHEAD, Staging

CHUNK = 4096
FH = 77


class Kernel:
    def __init__(self, backing_id: int = 1) -> None:
        self.backing_id = backing_id
        self.staged: dict[int, int] = {}  # handle -> staging fd
        self.inodes: dict[int, int] = {}  # inode -> handle
        self.shares: dict[int, int] = {}  # a reader's handle -> the staged handle

    def passthrough(self) -> bool:
        return True

    def stage(self, fh: int, ino: int, fd: int) -> bool:
        self.staged[fh] = fd
        self.inodes[ino] = fh
        return True

    def staged_id(self, fh: int) -> int:
        return self.backing_id

    def unstage(self, fh: int) -> None:
        del self.staged[fh]
        assert fh not in self.shares.values(), "a backing id given back while a reader's reply waits"

    def share(self, ino: int, fh: int) -> bool:
        if self.backing_id <= 0 or ino not in self.inodes or self.inodes[ino] not in self.staged:
            return False
        self.shares[fh] = self.inodes[ino]
        return True

    def unshare(self, fh: int) -> None:
        self.shares.pop(fh, None)

    def open_backing(self, fh: int, flags: int = os.O_RDWR) -> int:
        """The kernel's own open of the staging file (a passthrough open: the creator's, or
        with O_RDONLY a reader's)."""
        return os.open(f"/proc/self/fd/{self.staged[fh]}", flags)


class Store:
    def __init__(self) -> None:
        self.content = bytearray()
        self.writes: list[tuple[int, int]] = []  # (offset, length)
        self.opens = 0
        self.fail = False

    def open(self, ino: int, truncate: bool = False, privileged: bool = True) -> int:
        self.opens += 1
        return 1000 + ino

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        if self.fail:
            raise OSError(28, "no space")
        self.writes.append((offset, len(data)))
        end = offset + len(data)
        if end > len(self.content):
            self.content.extend(bytes(end - len(self.content)))
        self.content[offset:end] = data
        return len(data)

    async def release(self, fh: int) -> None:
        self.opens -= 1


def run(tmp_path: Path, body: Callable[[Staging, Kernel, Store], Awaitable[None]], backing_id: int = 1) -> None:
    kernel, store = Kernel(backing_id), Store()
    staging = Staging(store, Disk(), str(tmp_path), CHUNK, kernel)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(staging.run)
            await body(staging, kernel, store)
            nursery.cancel_scope.cancel()

    trio.run(main)


async def _until(check: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not check():
            await trio.sleep(0.005)


def test_an_absorb_takes_only_the_chunks_that_changed(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        assert 5 in staging and store.opens == 1
        backing = kernel.open_backing(FH)
        data = os.urandom(3 * CHUNK + 100)
        os.pwrite(backing, data, 0)
        await staging.absorb(5)
        assert store.content == data
        assert store.writes == [(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, CHUNK), (3 * CHUNK, 100)]
        store.writes.clear()
        await staging.absorb(5)  # nothing written since
        await staging.absorb(5, verify=True)  # read through: nothing differs
        assert store.writes == []
        os.pwrite(backing, b"x" * 10, CHUNK + 5)
        await staging.absorb(5)
        assert store.writes == [(CHUNK, CHUNK)]
        assert store.content == data[:CHUNK + 5] + b"x" * 10 + data[CHUNK + 15:]
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert store.opens == 0 and kernel.staged == {}

    run(tmp_path, body)


def test_the_close_takes_the_last_bytes(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"a" * 1000, 0)
        await staging.absorb(5)
        os.pwrite(backing, b"b" * 5000, 500)
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert store.content == b"a" * 500 + b"b" * 5000
        assert staging.absorbed_bytes == 1000 + CHUNK + (5500 - CHUNK)

    run(tmp_path, body)


def test_a_large_file_is_taken_while_it_is_written(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        for i in range(CHUNKS_AHEAD + 1):
            os.pwrite(backing, os.urandom(CHUNK), i * CHUNK)
        await _until(lambda: len(store.writes) >= CHUNKS_AHEAD)  # no absorb asked for
        assert store.writes[0] == (0, CHUNK)
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert len(store.content) == (CHUNKS_AHEAD + 1) * CHUNK

    run(tmp_path, body)


def test_a_truncate_is_made_to_the_staging_file_too(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"a" * (2 * CHUNK), 0)
        await staging.absorb(5)
        del store.content[100:]  # what the store's setattr does
        await staging.mirror_truncate(5, 100)
        assert os.fstat(backing).st_size == 100
        os.pwrite(backing, b"b" * 10, 200)
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert store.content == b"a" * 100 + bytes(100) + b"b" * 10

    run(tmp_path, body)


def test_a_staging_the_kernel_refused_is_given_back_untouched(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        await staging.absorb(5)
        assert 5 not in staging
        assert store.writes == [] and store.opens == 0 and staging.refused == 1

    run(tmp_path, body, backing_id=-22)


def test_what_the_store_refuses_stays_staged_until_the_mount_ends(tmp_path, caplog):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"a" * 100, 0)
        store.fail = True
        with pytest.raises(OSError):
            await staging.absorb(5)  # an fsync's would answer the error
        os.close(backing)
        await trio.sleep(0.1)
        assert 5 in staging  # the close's absorb failed too: nothing was lost
        store.fail = False
        await staging.close()
        assert store.content == b"a" * 100
        assert 5 not in staging and store.opens == 0

    run(tmp_path, body)
    assert "passthrough: end failed" in caplog.text


def test_a_staging_file_is_reused_only_once_the_kernel_closed_it(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        first = kernel.staged[FH]
        file = os.fstat(first).st_ino
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"a" * 100, 0)
        await staging.absorb(5)  # the FUSE file's RELEASE: a mapping may still write
        staging.begin(6, FH + 1, privileged=True)
        assert os.fstat(kernel.staged[FH + 1]).st_ino != file  # not handed on while open
        os.pwrite(backing, b"b" * 50, 0)  # (through the mapping)
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert store.content == b"b" * 50 + b"a" * 50  # what came after the release too
        staging.begin(7, FH + 2, privileged=True)
        assert os.fstat(kernel.staged[FH + 2]).st_ino == file  # emptied and reused now
        assert os.fstat(kernel.staged[FH + 2]).st_size == 0
        assert 6 in staging and 7 in staging

    run(tmp_path, body)


def test_a_reader_shares_the_backing_file_and_outlasts_the_creator(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        file = os.fstat(kernel.staged[FH]).st_ino
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"a" * 5000, 0)
        assert staging.open_for_passthrough(5) and not staging.open_for_passthrough(6)
        assert staging.share(5, 500) and not staging.share(6, 501)
        reader = kernel.open_backing(FH, os.O_RDONLY)
        os.close(backing)  # the creator's close: the reader still reads the staging file
        await _until(lambda: store.content == b"a" * 5000)
        assert 5 in staging and staging.open_for_passthrough(5)
        assert staging.share(5, 502)  # a reader after the creator's close shares it too
        await staging.unshare(502)
        assert 5 in staging
        assert os.pread(reader, 10, 4995) == b"a" * 5
        await staging.unshare(500)  # the last reader's release ends it
        assert 5 not in staging and store.opens == 0 and kernel.shares == {}
        staging.begin(7, FH + 2, privileged=True)
        assert os.fstat(kernel.staged[FH + 2]).st_ino != file  # its staging file is not reused
        assert os.pread(reader, 5000, 0) == b"a" * 5000  # nor emptied
        os.close(reader)
        assert staging.shared == 2

    run(tmp_path, body)


def test_a_readers_close_is_not_the_end(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        assert staging.share(5, 500)
        reader = kernel.open_backing(FH, os.O_RDONLY)
        os.close(reader)  # IN_CLOSE_NOWRITE
        await staging.unshare(500)
        await trio.sleep(0.1)
        assert 5 in staging
        os.pwrite(backing, b"b" * 100, 0)
        os.close(backing)
        await _until(lambda: 5 not in staging)
        assert store.content == b"b" * 100

    run(tmp_path, body)


def test_readers_left_at_the_mount_end_are_let_go(tmp_path):
    async def body(staging: Staging, kernel: Kernel, store: Store) -> None:
        staging.begin(5, FH, privileged=True)
        backing = kernel.open_backing(FH)
        os.pwrite(backing, b"c" * 10, 0)
        assert staging.share(5, 500)
        await staging.close()
        assert 5 not in staging and store.content == b"c" * 10 and kernel.shares == {}
        os.close(backing)

    run(tmp_path, body)
