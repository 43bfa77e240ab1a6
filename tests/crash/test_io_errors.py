"""I/O errors from the backing disk (FaultDisk): EIO on flush and write breaks the log for
good, EIO on read reaches the reader, ENOSPC reaches the writer and loses nothing."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from faultdisk import FaultDisk
from packfs import fsck
from packfs.store import records
from packfs.core import pack as packmod
from packfs.errors import FsError
from packfs.core.filesystem import Filesystem
from packfs.store.volumes import CROWDED_HOLD, META_RESERVE
from packs import KiB, lookup, read_file, run, small_options, tree, write_file

MiB = 1 << 20


def recovered(root: Path, disk: FaultDisk) -> dict:
    """Cut the power, recover, and return the tree; fsck must find the recovered pack clean."""
    image, _ = disk.power_cut(mode="none")
    out = run(root, image, tree)
    rep = fsck.check(str(root), disk=image)
    assert rep.exit_code == 0, [f.message for f in rep.findings]
    return out


@pytest.mark.parametrize("op", ["fdatasync", "pwrite"])
def test_eio_on_flush_or_write_fails_that_fsync_and_every_later_one(tmp_path: Path, op: str) -> None:
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs: Filesystem) -> None:
        await write_file(fs, "/acked", b"a" * 10000)
        nameless = fs.create_unlinked(1, 0o100600, 0, 0)  # its fsync commits nothing
        fh = fs.open(nameless.ino)
        fault = disk.inject(op, errno.EIO, times=1)
        with pytest.raises(FsError) as e:
            await write_file(fs, "/failed", b"f" * 10000)
        assert e.value.errno == errno.EIO and fault.hits == 1
        # The fault is gone, but the log stays broken: like errors=remount-ro, never retried.
        for name in ("/later", "/later2"):
            with pytest.raises(FsError) as e:
                await write_file(fs, name, b"l" * 10000)
            assert e.value.errno == errno.EIO
        for file in (None, fh):
            with pytest.raises(FsError) as e:
                await fs.fsync(fh=file)
            assert e.value.errno == errno.EIO
        assert (await fs.stats())["broken"]
        # What was durable still reads.
        assert await read_file(fs, "/acked") == b"a" * 10000
        with pytest.raises(FsError):
            await fs.close()
    run(root, disk, work, clean=False)
    after = recovered(root, disk)
    assert after["/acked"] == b"a" * 10000
    assert "/later" not in after and "/later2" not in after


def test_eio_on_read_reaches_the_reader_and_is_not_cached(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def fill(fs: Filesystem) -> None:
        await write_file(fs, "/bad", os.urandom(20000))
        await write_file(fs, "/good", b"g" * 20000)
    run(root, disk, fill)
    bad_record: list[int] = []

    async def read(fs: Filesystem) -> None:
        ino = lookup(fs, "/bad")
        e = fs.getattr(ino).extent_list()[0]
        bad_record.append(e[3])
        fault = disk.inject("pread", errno.EIO, times=None, when=lambda p, off, n: off == e[3])
        for _ in range(2):
            with pytest.raises(FsError) as err:
                await read_file(fs, "/bad")
            assert err.value.errno == errno.EIO
        assert await read_file(fs, "/good") == b"g" * 20000
        disk.faults.remove(fault)
        assert len(await read_file(fs, "/bad")) == 20000  # no poisoned cache
    run(root, disk, read)


def test_eio_during_recovery_fails_the_mount_and_cuts_nothing(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def fill(fs: Filesystem) -> None:
        for i in range(3):
            await write_file(fs, f"/f{i}", bytes([i]) * 6000)
    run(root, disk, fill, clean=False)  # three commits to replay
    image, _ = disk.power_cut(mode="none")
    before = image.snapshot()
    image.inject("pread", errno.EIO, nth=3, times=1)
    opts = small_options()
    with pytest.raises(OSError):
        packmod.open_pack(str(root), image, opts.volume_size, opts.cache_size)
    for path, st in before.files.items():  # nothing was truncated
        assert image.files[path].live.size == st.live.size
    image.clear_faults()
    after = run(root, image, tree)
    assert after == {f"/f{i}": bytes([i]) * 6000 for i in range(3)}


def test_enospc_reaches_the_writer_loses_nothing_and_space_comes_back(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    disk = FaultDisk(str(root), capacity=48 * MiB)  # data never takes the last 32 MiB (volumes.HEADROOM)
    acked: dict[str, bytes] = {}

    async def work(fs: Filesystem) -> None:
        errors = []
        for i in range(100):
            data = bytes([i]) * (512 * KiB)
            try:
                await write_file(fs, f"/f{i:02d}", data)
                acked[f"/f{i:02d}"] = data
            except FsError as e:
                errors.append(e.errno)
                fs.unlink(1, f"f{i:02d}".encode())
                break
        assert errors == [errno.ENOSPC], errors
        assert 10 <= len(acked) < 100
        assert not fs.volumes.broken  # ENOSPC is not an I/O error: the log is fine
        for name, data in acked.items():
            assert await read_file(fs, name) == data
        # Metadata still commits on a full disk: unlink most files to free space.
        for name in sorted(acked)[3:]:
            fs.unlink(1, name[1:].encode())
            del acked[name]
        await fs.fsync()
        # Their space comes back (a checkpoint punches them), and writes work again.
        for i in range(100, 110):
            data = bytes([i]) * (512 * KiB)
            await write_file(fs, f"/f{i:02d}", data)
            acked[f"/f{i:02d}"] = data
        for name, data in acked.items():
            assert await read_file(fs, name) == data
    run(root, disk, work, opts=small_options(volume_size=64 * MiB), clean=False)
    assert recovered(root, disk) == acked


def test_enospc_then_space_freed_outside_the_pack(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    disk = FaultDisk(str(root), capacity=40 * MiB)

    async def work(fs: Filesystem) -> None:
        with pytest.raises(FsError) as e:
            for i in range(100):
                await write_file(fs, f"/f{i:02d}", bytes([i]) * (512 * KiB))
        assert e.value.errno == errno.ENOSPC
        disk.capacity = 400 * MiB  # the operator freed space on the backing disk
        await write_file(fs, "/after", b"x" * (2 * MiB))
        assert await read_file(fs, "/after") == b"x" * (2 * MiB)
    run(root, disk, work, opts=small_options(volume_size=64 * MiB))
    assert fsck.check(str(root), disk=disk).exit_code == 0


def test_eio_on_a_flush_of_preallocated_zeros_breaks_the_log(tmp_path: Path) -> None:
    """Linux reports a writeback error to one fdatasync only: if the preallocator's flush
    takes it, the report may be of a record's lost write, so no later fsync may succeed."""
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs: Filesystem) -> None:
        await write_file(fs, "/acked", b"a" * 10000)
        v = fs.volumes
        with trio.fail_after(30):  # the mount's own zero-filling must not take the fault
            while not v.preallocator_idle:
                await trio.sleep(0.01)
        await trio.sleep(CROWDED_HOLD)  # the fsync above was not alone: zeros wait that long
        fault = disk.inject("fdatasync", errno.EIO, times=1)
        # A writer that rolls the log over to a fresh volume gets all of it but the last
        # block before the volume's limit fallocated; the preallocator writes zeros over
        # that block, then flushes them.
        await v.ensure_space(v.volume_size - records.BLOCK)
        assert v.allocated == v.volume_size + META_RESERVE - records.BLOCK
        with trio.fail_after(10):
            while not (await fs.stats())["broken"]:
                await trio.sleep(0.01)
        assert fault.hits == 1
        with pytest.raises(FsError) as e:
            await write_file(fs, "/later", b"l" * 10000)
        assert e.value.errno == errno.EIO
        assert await read_file(fs, "/acked") == b"a" * 10000
        with pytest.raises(FsError):
            await fs.close()
    run(root, disk, work, clean=False)
    after = recovered(root, disk)
    assert after["/acked"] == b"a" * 10000 and "/later" not in after
