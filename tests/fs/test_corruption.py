"""A flipped byte in a volume: EIO for that file only, and fsck names it."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsutil import raises_errno, read_file, write_file
from mounts import mounted

MARKER = b"packfs-corruption-test-marker:" + b"0123456789abcdef0123456789abcdef!!"
assert len(MARKER) == 64


def _populate(mnt: Path) -> dict[str, bytes]:
    os.makedirs(mnt / "objects" / "part")
    files = {
        "objects/part/victim.data": b"before " * 500 + MARKER + b" after" * 500,
        "objects/part/neighbour.data": os.urandom(5000),
        "other.data": os.urandom(300_000),
        "small": b"tiny",
    }
    for name, data in files.items():
        write_file(mnt / name, data, fsync=True)
    return files


def _flip_marker(packdir: Path) -> None:
    hits = []
    for vol in sorted((packdir / "volumes").glob("*.pack")):
        data = vol.read_bytes()
        pos = data.find(MARKER)
        while pos >= 0:
            hits.append((vol, pos))
            pos = data.find(MARKER, pos + 1)
    assert len(hits) == 1, f"expected the marker exactly once in the volumes, found {hits}"
    vol, pos = hits[0]
    with open(vol, "r+b") as f:
        f.seek(pos + 10)
        b = f.read(1)
        f.seek(pos + 10)
        f.write(bytes([b[0] ^ 0x01]))
        f.flush()
        os.fsync(f.fileno())


@pytest.fixture
def corrupted(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        files = _populate(mnt)
    _flip_marker(packdir)
    return packdir, mnt, files


def test_flipped_byte_reads_as_eio(corrupted):
    packdir, mnt, files = corrupted
    with mounted(packdir, mnt):
        victim = mnt / "objects/part/victim.data"
        # Metadata is in memory and unaffected.
        assert os.stat(victim).st_size == len(files["objects/part/victim.data"])
        with raises_errno(errno.EIO):
            read_file(victim)
        # Asking again is still EIO (no cached bad data, no crash of the daemon).
        with raises_errno(errno.EIO):
            with open(victim, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                f.read(65536)
        for name, data in files.items():
            if name != "objects/part/victim.data":
                assert read_file(mnt / name) == data, name
        # The rest of the filesystem keeps working, and the file can be replaced (Swift
        # quarantines by renaming it away, then writes a fresh copy).
        os.makedirs(mnt / "quarantined")
        os.rename(victim, mnt / "quarantined" / "victim.data")
        write_file(victim, b"fresh copy", fsync=True)
        assert read_file(victim) == b"fresh copy"


def _fsck(packdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packfs.cli", "fsck", str(packdir), *args],
                          capture_output=True, text=True, timeout=300)


def test_fsck_clean_pack_exits_zero(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as mnt:
        _populate(mnt)
    r = _fsck(packdir)
    assert r.returncode == 0, f"packfs fsck on a clean pack failed ({r.returncode}): {r.stdout}{r.stderr}"


def test_fsck_names_the_corrupt_file(corrupted):
    packdir, mnt, files = corrupted
    r = _fsck(packdir)
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"packfs fsck found nothing wrong in a corrupted pack: {out}"
    assert "No module named" not in out, f"packfs fsck is not implemented yet: {out.strip().splitlines()[-1]}"
    assert "objects/part/victim.data" in out, f"fsck does not name the damaged file: {out}"
    for name in files:
        if name != "objects/part/victim.data":
            assert name not in out.replace("objects/part/victim.data", ""), f"fsck blames intact {name}: {out}"
    # Without --repair, fsck changes nothing: the file still reads as EIO.
    with mounted(packdir, mnt):
        with raises_errno(errno.EIO):
            read_file(mnt / "objects/part/victim.data")
