"""`packfs mount` refuses what it cannot serve with one line on stderr and exit status 1,
and leaves nothing mounted (README, Command line)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mounts import PACKFS, is_mounted, mounted


def _refused(packdir: Path, mountpoint: Path) -> str:
    p = subprocess.run([*PACKFS, "mount", str(packdir), str(mountpoint)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("packfs: "), p.stderr
    assert not is_mounted(mountpoint)
    return p.stderr


def test_a_missing_or_busy_mount_point(tmp_path):
    assert "does not exist" in _refused(tmp_path / "pack", tmp_path / "missing")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_bytes(b"")
    assert "is not empty" in _refused(tmp_path / "pack", tmp_path / "busy")


def test_a_pack_mounted_elsewhere(tmp_path):
    (tmp_path / "other").mkdir()
    with mounted(tmp_path / "pack", tmp_path / "mnt"):
        assert "in use" in _refused(tmp_path / "pack", tmp_path / "other")


def test_a_pack_on_a_read_only_filesystem(tmp_path):
    """A disk the kernel remounted read-only after errors, say: said so, not an errno."""
    (tmp_path / "mnt").mkdir()
    with mounted(tmp_path / "pack", tmp_path / "mnt"):
        pass
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        assert "read-only filesystem" in _refused(ro / "pack", tmp_path / "mnt")
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.parametrize("what", ["a file", "a foreign directory"])
def test_a_pack_directory_that_is_not_one(tmp_path, what):
    (tmp_path / "mnt").mkdir()
    if what == "a file":
        (tmp_path / "pack").write_bytes(b"")
    else:
        (tmp_path / "pack").mkdir()
        (tmp_path / "pack" / "somebody's").write_bytes(b"data")
    _refused(tmp_path / "pack", tmp_path / "mnt")
