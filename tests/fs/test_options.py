"""The same guarantees under non-default mount options: small volumes (the log rolls over
many times), tiny write-behind chunks and a tight dirty limit (backpressure)."""
from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import pytest

from fsutil import backing_usage, fsync_dir, read_file, sha256_file, write_file
from mounts import kill9, mounted
from test_kill9 import Writers, content, log_since, log_size

KiB, MiB = 1 << 10, 1 << 20
SMALL_VOLUMES = "volume_size=8M"
TINY_CHUNKS = "disk_chunk_size=64K,max_dirty=256K"


def _volumes(packdir) -> list[str]:
    return sorted(os.listdir(packdir / "volumes"))


def test_small_volumes_roll_over_and_persist(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    rnd = random.Random(3)
    files = {f"f{i:03d}": rnd.randbytes(rnd.choice([1000, 300 * KiB, 1 * MiB + 5, 3 * MiB])) for i in range(40)}
    with mounted(packdir, mnt, SMALL_VOLUMES):
        for i, (name, data) in enumerate(files.items()):
            write_file(mnt / name, data, fsync=(i % 2 == 0))
        fsync_dir(mnt)
        for name, data in files.items():
            assert read_file(mnt / name) == data, name
    assert len(_volumes(packdir)) >= 5, _volumes(packdir)
    with mounted(packdir, mnt, SMALL_VOLUMES):
        for name, data in files.items():
            assert read_file(mnt / name) == data, name
        # Overwrite and delete across volumes, then remount again.
        for i, name in enumerate(list(files)):
            if i % 3 == 0:
                os.unlink(mnt / name)
                del files[name]
            elif i % 3 == 1:
                with open(mnt / name, "r+b") as f:
                    f.seek(len(files[name]) // 2)
                    f.write(b"patched")
                d = bytearray(files[name])
                d[len(d) // 2:len(d) // 2 + 7] = b"patched"
                files[name] = bytes(d)
    with mounted(packdir, mnt, SMALL_VOLUMES):
        assert sorted(os.listdir(mnt)) == sorted(files)
        for name, data in files.items():
            assert read_file(mnt / name) == data, name


def test_small_volumes_kill9_recovers_across_rollovers(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    acked: set[str] = set()
    for rnd_round in range(2):
        with mounted(packdir, mnt, SMALL_VOLUMES):
            logged = log_size(packdir)
            for name in sorted(acked):
                assert read_file(mnt / name) == content(name), f"round {rnd_round}: {name}"
            root_fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with Writers(root_fd, f"r{rnd_round}") as w:
                    deadline = time.monotonic() + 30
                    vols = len(_volumes(packdir))
                    # Let the log roll over a few times before the crash.
                    while (len(_volumes(packdir)) < vols + 3 or len(w.acked) < 20) and \
                            time.monotonic() < deadline and not w.unexpected:
                        time.sleep(0.05)
                    killed_at = time.monotonic()
                    kill9(packdir, mnt)
            finally:
                os.close(root_fd)
            # As in test_kill9: an EIO after the kill with no ERROR in the daemon's log is
            # the kernel's, for a request the dying daemon was reading; any other error fails.
            unexpected = w.unexpected_after(killed_at, log_since(packdir, logged))
            assert not unexpected, (f"killed at {killed_at:.3f}", *unexpected[:3])
            acked |= w.acked
    with mounted(packdir, mnt, SMALL_VOLUMES) as m:
        for name in sorted(acked):
            assert read_file(m / name) == content(name), f"{name} lost after kill -9 across volume roll-overs"


def test_small_volumes_delete_heavy_usage_bounded(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    data = b"z" * (64 * KiB)
    with mounted(packdir, mnt, SMALL_VOLUMES):
        for r in range(3):
            for i in range(600):
                write_file(mnt / f"r{r}-{i}", data)
            fsync_dir(mnt)
            for i in range(600):
                os.unlink(mnt / f"r{r}-{i}")
            fsync_dir(mnt)
    with mounted(packdir, mnt, SMALL_VOLUMES):
        used = backing_usage(packdir)
        per_volume = {n: os.stat(packdir / "volumes" / n).st_blocks * 512 // KiB for n in _volumes(packdir)}
        assert used <= 32 * MiB, (f"{used / MiB:.1f} MiB used by an empty pack after 3 x 600 x 64 KiB were "
                                  f"written and deleted; KiB allocated per volume: {per_volume}")
        assert os.listdir(mnt) == []


def test_tiny_chunks_and_backpressure_32_writers(mnt_tiny):
    mnt = mnt_tiny
    errors: list[BaseException] = []
    digests: dict[str, str] = {}

    def writer(n: int) -> None:
        try:
            rnd = random.Random(n)
            for k in range(4):
                data = rnd.randbytes(rnd.choice([100, 65 * KiB, 700 * KiB]))
                p = mnt / f"w{n}-{k}"
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
                try:
                    for pos in range(0, len(data), 4096):  # small writes: many chunk flushes
                        os.write(fd, data[pos:pos + 4096])
                    if k % 2:
                        os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    assert os.pread(fd, len(data) + 1, 0) == data
                finally:
                    os.close(fd)
                digests[str(p)] = hashlib.sha256(data).hexdigest()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    for p, d in digests.items():
        assert sha256_file(p) == d, p


@pytest.fixture
def mnt_tiny(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt", TINY_CHUNKS) as m:
        yield m


def test_tiny_chunks_stream_and_remount(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, TINY_CHUNKS):
        rnd = random.Random(11)
        data = rnd.randbytes(20 * MiB)
        write_file(mnt / "stream", data, fsync=True)
        assert sha256_file(mnt / "stream") == hashlib.sha256(data).hexdigest()
    with mounted(packdir, mnt, TINY_CHUNKS):
        assert sha256_file(mnt / "stream") == hashlib.sha256(data).hexdigest()
