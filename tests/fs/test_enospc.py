"""ENOSPC: packfs on a small loop-mounted ext4. Filling it fails cleanly with ENOSPC, the
mount stays usable, nothing fsync'd is lost, and space freed by unlinking is usable again."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path
from typing import Iterator

import pytest

from fsutil import fsync_dir, loop_ext4, read_file
from mounts import force_unmount, is_mounted, mounted

KiB, MiB = 1 << 10, 1 << 20
IMAGE_SIZE = 200 * MiB
FILE_SIZE = 4 * MiB


@contextlib.contextmanager
def packfs_on_small_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    mnt = tmp_path / "mnt"
    with loop_ext4(tmp_path, IMAGE_SIZE) as backing:
        packdir = backing / "pack"
        try:
            yield packdir, mnt
        finally:
            if is_mounted(mnt):
                force_unmount(mnt, packdir)


def _pattern(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (FILE_SIZE // 32)


def fill(mnt: Path) -> tuple[dict[str, bytes], str, str]:
    """Write 4 MiB files (64 KiB writes, fsync file then dir) until one fails.

    Returns the fsync'd files, the name of the file that failed, and the failing step.
    """
    durable: dict[str, bytes] = {}
    os.makedirs(mnt / "fill")
    fsync_dir(mnt)
    for i in range(1000):
        name = f"fill/f{i:04d}"
        data = _pattern(i)
        step = "open"
        try:
            fd = os.open(mnt / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                step = "write"
                for pos in range(0, len(data), 64 * KiB):
                    os.write(fd, data[pos:pos + 64 * KiB])
                step = "fsync"
                os.fsync(fd)
            finally:
                step_before_close = step
                step = "close"
                os.close(fd)
                step = step_before_close
            step = "fsync(dir)"
            fsync_dir(mnt / "fill")
        except OSError as e:
            assert e.errno == errno.ENOSPC, f"{name}: {step} failed with {errno.errorcode.get(e.errno)}, not ENOSPC"
            return durable, name, step
        durable[name] = data
    raise AssertionError("a 200 MiB disk took 4 GiB without ENOSPC")


def check_usable_and_intact(mnt: Path, durable: dict[str, bytes]) -> None:
    assert os.path.isdir(mnt / "fill")
    names = set(os.listdir(mnt / "fill"))
    for name, data in durable.items():
        assert os.path.basename(name) in names, f"fsync'd {name} vanished"
        assert os.stat(mnt / name).st_size == len(data)
        assert read_file(mnt / name) == data, f"fsync'd {name} reads back wrong"


def free_all_but(mnt: Path, durable: dict[str, bytes], failed: str, keep: int) -> dict[str, bytes]:
    """Unlink all fsync'd files but `keep`, and the one that failed; fsync the directory."""
    kept = dict(list(durable.items())[:keep])
    for name in list(durable)[keep:]:
        os.unlink(mnt / name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(mnt / failed)
    fsync_dir(mnt / "fill")
    return kept


def write_more(mnt: Path, count: int) -> dict[str, bytes]:
    more = {}
    for i in range(count):
        name = f"again{i}"
        data = _pattern(10_000 + i)
        fd = os.open(mnt / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            for pos in range(0, len(data), 64 * KiB):
                os.write(fd, data[pos:pos + 64 * KiB])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(mnt)
        more[name] = data
    return more


def test_enospc_mount_stays_usable_and_freed_space_returns(tmp_path):
    with packfs_on_small_disk(tmp_path) as (packdir, mnt):
        with mounted(packdir, mnt):
            durable, failed, step = fill(mnt)
            assert len(durable) >= 20, f"ENOSPC after only {len(durable)} files of 4 MiB on a 200 MiB disk"
            # Still usable: stat, listing, reads, metadata changes.
            check_usable_and_intact(mnt, durable)
            os.stat(mnt / failed)
            os.setxattr(mnt / "fill", "user.after_enospc", b"ok")
            os.mkdir(mnt / "dir_after_enospc")
            fsync_dir(mnt)
            # Unlinking makes room again, without a remount: new 4 MiB files fit.
            kept = free_all_but(mnt, durable, failed, keep=5)
            try:
                more = write_more(mnt, 10)
            except OSError as e:
                pytest.fail(f"after unlinking {len(durable) - 5} files of 4 MiB and fsync(dir), writing a new "
                            f"4 MiB file still fails: {errno.errorcode.get(e.errno)} ({e}); backing disk has "
                            f"{os.statvfs(packdir).f_bavail * os.statvfs(packdir).f_frsize // MiB} MiB free")
            check_usable_and_intact(mnt, kept)
        with mounted(packdir, mnt):
            check_usable_and_intact(mnt, kept)
            for name, data in more.items():
                assert read_file(mnt / name) == data


def test_enospc_freed_space_returns_after_remount(tmp_path):
    with packfs_on_small_disk(tmp_path) as (packdir, mnt):
        with mounted(packdir, mnt):
            durable, failed, step = fill(mnt)
            kept = free_all_but(mnt, durable, failed, keep=5)
        with mounted(packdir, mnt):
            check_usable_and_intact(mnt, kept)
            more = write_more(mnt, 10)
        with mounted(packdir, mnt):
            check_usable_and_intact(mnt, kept)
            for name, data in more.items():
                assert read_file(mnt / name) == data


def test_enospc_nothing_fsynced_lost_across_remount(tmp_path):
    with packfs_on_small_disk(tmp_path) as (packdir, mnt):
        with mounted(packdir, mnt):
            durable, failed, step = fill(mnt)
            # Keep hitting the full disk a few more times: small files, xattrs, renames.
            for i in range(5):
                with contextlib.suppress(OSError):
                    p = mnt / f"small{i}"
                    p.write_bytes(b"x" * 100_000)
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
        with mounted(packdir, mnt):
            check_usable_and_intact(mnt, durable)
