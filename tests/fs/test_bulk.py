"""Streaming a large file, many concurrent writers, and persistence across remounts."""
from __future__ import annotations

import hashlib
import os
import random
import stat
import threading

from fsutil import fsync_dir, read_file, sha256_file, snapshot_tree, write_file
from mounts import mounted, umount

KiB, MiB = 1 << 10, 1 << 20


def _stream(path, total: int, piece: int, seed: int) -> str:
    """Write `total` pseudo-random bytes in `piece`-sized writes; fsync; return the sha256."""
    rnd = random.Random(seed)
    block = rnd.randbytes(MiB + piece)
    h = hashlib.sha256()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        for i in range(total // piece):
            off = (i * 7919 * 64) % MiB  # vary the contents without generating 256 MiB of randomness
            chunk = block[off:off + piece]
            assert os.write(fd, chunk) == piece
            h.update(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest()


def test_256mib_stream_in_64k_writes(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    total = 256 * MiB
    with mounted(packdir, mnt):
        digest = _stream(mnt / "big", total, 64 * KiB, seed=1)
        fsync_dir(mnt)
        assert os.stat(mnt / "big").st_size == total
        assert sha256_file(mnt / "big") == digest
        # Read back in Swift's 64 KiB pieces, at an odd offset too.
        with open(mnt / "big", "rb") as f:
            f.seek(total - 3 * 64 * KiB - 17)
            assert len(f.read()) == 3 * 64 * KiB + 17
    with mounted(packdir, mnt):
        assert os.stat(mnt / "big").st_size == total
        assert sha256_file(mnt / "big") == digest


def test_32_concurrent_writers(mnt):
    errors: list[BaseException] = []
    digests: dict[str, str] = {}
    lock = threading.Lock()

    def writer(n: int) -> None:
        try:
            rnd = random.Random(n)
            os.makedirs(mnt / f"w{n % 4}", exist_ok=True)
            for k in range(6):
                size = rnd.choice([0, 1, 4 * KiB, 64 * KiB + 3, 300 * KiB, 2 * MiB + 5])
                data = rnd.randbytes(size)
                p = mnt / f"w{n % 4}" / f"file-{n}-{k}"
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                try:
                    for pos in range(0, size, 64 * KiB):
                        os.write(fd, data[pos:pos + 64 * KiB])
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_dir(p.parent)
                with lock:
                    digests[str(p)] = hashlib.sha256(data).hexdigest()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(digests) == 32 * 6
    for p, d in digests.items():
        assert sha256_file(p) == d, p
    assert sum(len(os.listdir(mnt / f"w{i}")) for i in range(4)) == 32 * 6


def _build_tree(root) -> None:
    rnd = random.Random(7)
    os.makedirs(root / "objects" / "1023" / "abc" / "d41d8cd98f00b204e9800998ecf8427e")
    os.makedirs(root / "tmp")
    os.makedirs(root / "empty_dir", 0o700)
    for i in range(40):
        size = rnd.choice([0, 1, 100, 4096, 65536, 1 << 20, 3 * MiB + 7])
        p = root / "objects" / f"f{i:03d}.data"
        write_file(p, rnd.randbytes(size), mode=0o600 + (i % 3) * 0o40)
        os.setxattr(p, "user.swift.metadata", rnd.randbytes(rnd.choice([10, 4000, 65536])))
        if i % 5 == 0:
            os.setxattr(p, "user.swift.metadata1", rnd.randbytes(1000))
    deep = root / "objects" / "1023" / "abc" / "d41d8cd98f00b204e9800998ecf8427e"
    write_file(deep / "1700000000.00000.data", rnd.randbytes(70_000))
    os.setxattr(deep, "user.dirattr", b"on a directory")
    os.link(root / "objects" / "f001.data", deep / "hardlink.data")
    os.link(root / "objects" / "f001.data", root / "tmp" / "second-link")
    os.symlink("../objects/f002.data", root / "tmp" / "rel-link")
    os.symlink("/absolute/dangling/target", root / "tmp" / "dangling")
    os.mknod(root / "tmp" / "fifo", stat.S_IFIFO | 0o640)
    # A sparse file with a hole in the middle and a truncated tail.
    with open(root / "sparse", "wb") as f:
        f.write(b"head")
        f.seek(5 * MiB)
        f.write(b"tail")
    os.truncate(root / "sparse", 6 * MiB)
    # Modes, owners and times of every kind.
    os.chmod(root / "objects" / "f003.data", 0o4751)
    os.chown(root / "objects" / "f004.data", 1000, 2000)
    os.lchown(root / "tmp" / "rel-link", 3000, 4000)
    os.chmod(root / "empty_dir", 0o1730)
    for i, p in enumerate(sorted((root / "objects").glob("f*.data"))):
        os.utime(p, ns=(1_500_000_000_000_000_000 + i * 1_000_000_007, 1_600_000_000_123_456_789 + i))
    os.utime(root / "tmp" / "rel-link", ns=(12345, 67890), follow_symlinks=False)
    # Removals and renames must persist too.
    write_file(root / "tmp" / ".tmpXYZ", b"renamed into place")
    os.rename(root / "tmp" / ".tmpXYZ", deep / "1700000001.00000.data")
    write_file(root / "gone", b"unlinked")
    os.unlink(root / "gone")
    # Times of directories last, after their contents changed.
    os.utime(root / "empty_dir", ns=(42, 43))
    os.utime(deep, ns=(44, 45))


def test_tree_persists_across_unmount_and_mount(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "noatime"):  # (snapshot_tree)
        _build_tree(mnt)
        before = snapshot_tree(mnt)
    with mounted(packdir, mnt, "noatime"):
        after = snapshot_tree(mnt)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], name
    # A second cycle, with a change in between, persists as well.
    with mounted(packdir, mnt, "noatime"):
        os.unlink(mnt / "objects" / "f005.data")
        os.setxattr(mnt / "objects" / "f006.data", "user.swift.metadata", b"updated")
        before = snapshot_tree(mnt)
    with mounted(packdir, mnt, "noatime"):
        assert snapshot_tree(mnt) == before
        assert os.getxattr(mnt / "objects" / "f006.data", "user.swift.metadata") == b"updated"


def test_unmount_flushes_unsynced_writes(tmp_path, packdir):
    """A clean unmount keeps writes that were closed but never fsync'd."""
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        write_file(mnt / "a", b"never fsynced" * 1000)
        os.makedirs(mnt / "d")
        write_file(mnt / "d" / "b", b"")
        os.setxattr(mnt / "d" / "b", "user.x", b"y")
    with mounted(packdir, mnt):
        assert read_file(mnt / "a") == b"never fsynced" * 1000
        assert os.getxattr(mnt / "d" / "b", "user.x") == b"y"


def test_packfs_umount_cli(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        write_file(mnt / "f", b"x")
        umount(packdir, mnt)
        assert os.listdir(mnt) == []
    with mounted(packdir, mnt):
        assert read_file(mnt / "f") == b"x"
