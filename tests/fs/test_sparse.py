"""st_blocks counts the data a file holds, not its size: du and cp --sparse see holes.
SEEK_DATA / SEEK_HOLE: pyfuse3 has no lseek handler, so libfuse answers the kernel's first
FUSE_LSEEK with ENOSYS and the kernel's generic llseek serves them from then on, the whole
file as data (consistent, not sparse-aware: docs/architecture.md)."""
from __future__ import annotations

import os
import subprocess

from fsutil import FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, fallocate, read_file
from mounts import mounted

KiB = 1 << 10
SIZE = 1_650_000


def _sparse(path) -> None:
    """1.65 MB with 50 KiB written: 25 KiB at each end, the rest a hole."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.pwrite(fd, b"a" * (25 * KiB), 0)
        os.pwrite(fd, b"b" * (25 * KiB), SIZE - 25 * KiB)
        assert os.fstat(fd).st_blocks == 100, "the buffered run counts before it is flushed"
    finally:
        os.close(fd)


def test_st_blocks_of_a_sparse_file_counts_its_data(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        _sparse(mnt / "sparse")
        st = os.stat(mnt / "sparse")
        assert (st.st_size, st.st_blocks) == (SIZE, 100)
        du = subprocess.run(["du", "-k", str(mnt / "sparse")], check=True, capture_output=True, text=True)
        assert du.stdout.split()[0] == "50"
        (mnt / "whole").write_bytes(b"w" * 10_000)  # one whole record: its size, rounded up
        assert os.stat(mnt / "whole").st_blocks == 20
        fd = os.open(mnt / "whole", os.O_WRONLY)
        try:
            fallocate(fd, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE, 4096, 4096)
            fallocate(fd, 0, 0, 1 << 20)  # grows the file; packed data holds no blocks in advance
        finally:
            os.close(fd)
        st = os.stat(mnt / "whole")
        assert (st.st_size, st.st_blocks) == (1 << 20, 12)
    with mounted(packdir, mnt):  # the maps as the catalog or image gives them back
        assert os.stat(mnt / "sparse").st_blocks == 100
        assert os.stat(mnt / "whole").st_blocks == 12
        data = read_file(mnt / "sparse")
        assert data == b"a" * (25 * KiB) + bytes(SIZE - 50 * KiB) + b"b" * (25 * KiB)


def test_seek_data_and_seek_hole_see_the_whole_file_as_data(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        _sparse(mnt / "sparse")
        fd = os.open(mnt / "sparse", os.O_RDONLY)
        try:
            for _ in range(2):  # the first asks packfs (ENOSYS), the second the kernel alone
                assert os.lseek(fd, 0, os.SEEK_HOLE) == SIZE
                assert os.lseek(fd, 30 * KiB, os.SEEK_DATA) == 30 * KiB
        finally:
            os.close(fd)
