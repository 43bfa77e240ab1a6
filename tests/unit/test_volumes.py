"""The volume log without FUSE: background preallocation and warm reads on the loop."""
from __future__ import annotations

import os

import trio

from packfs import records
from packfs.disk import Disk
from packfs.volumes import PREALLOC_AHEAD, PREALLOC_STEP, Volumes, volume_name

PACK_ID = 7


def volumes(tmp_path, volume_size: int = 1 << 30) -> Volumes:
    v = Volumes(Disk(), str(tmp_path), PACK_ID, volume_size, cache_bytes=1 << 20)
    v.open_tail(1, 0, 1)
    return v


def test_preallocator_keeps_flushed_zeros_ahead_of_the_tail(tmp_path):
    v = volumes(tmp_path)
    payload = os.urandom(100_000)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(v.run)
            nursery.start_soon(v.run_preallocator)
            await v.ensure_space(records.footprint(len(payload)))  # as every writer does first
            vol, off, ticket = v.append(records.DATA, 5, 0, payload, sync=True)
            await v.wait_durable(ticket)
            while v.allocated - v.tail < PREALLOC_AHEAD:
                await trio.sleep(0.01)
            assert v.allocated - v.tail < PREALLOC_AHEAD + PREALLOC_STEP  # no more than asked for
            assert v.disk.size(v.fd(1)) == v.allocated
            assert await v.read(vol, off, len(payload), 5) == payload
            nursery.cancel_scope.cancel()

    trio.run(main)
    with open(os.path.join(tmp_path, volume_name(1)), "rb") as f:
        f.seek(records.footprint(len(payload)))
        assert f.read(1 << 20) == bytes(1 << 20)  # prepared space is zeros: the log ends there
    v.close()


def test_preallocator_stays_inside_a_small_volume(tmp_path):
    v = volumes(tmp_path, volume_size=256 << 10)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(v.run)
            nursery.start_soon(v.run_preallocator)
            _, _, ticket = v.append(records.DATA, 5, 0, b"x" * 5000, sync=True)
            await v.wait_durable(ticket)
            await trio.sleep(0.2)
            assert v.active == 1  # never rolls over on its own
            assert v.allocated <= v.volume_size + (4 << 20)
            nursery.cancel_scope.cancel()

    trio.run(main)
    v.close()


def test_warm_reads_are_checked_like_cold_ones(tmp_path):
    v = volumes(tmp_path)
    payload = os.urandom(20_000)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(v.run)
            vol, off, ticket = v.append(records.DATA, 9, 0, payload, sync=True)
            await v.wait_durable(ticket)
            assert v.disk.pread_cached(v.fd(vol), 4096, off) is not None  # just written: in the page cache
            assert await v.read(vol, off, len(payload), 9) == payload
            v._cache.clear()
            os.pwrite(v.fd(vol), b"\x00", off + records.HEADER_SIZE + 100)  # flip a byte in place
            try:
                await v.read(vol, off, len(payload), 9)
            except Exception as e:  # noqa: BLE001
                assert getattr(e, "errno", None) == 5  # EIO, never wrong bytes
            else:
                raise AssertionError("a corrupted warm record was returned")
            nursery.cancel_scope.cancel()

    trio.run(main)
    v.close()
