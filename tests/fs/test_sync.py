"""`packfs sync MOUNTPOINT`: sync(1) and syncfs(2) do not reach a FUSE daemon (the kernel
sends FUSE_SYNCFS to virtiofs only), so this commits everything and returns once the
device has flushed it."""
from __future__ import annotations

import os
import subprocess

from fsutil import read_file, write_file
from mounts import PACKFS, kill9, mounted, stats


def _sync(mnt) -> subprocess.CompletedProcess:
    return subprocess.run([*PACKFS, "sync", str(mnt)], capture_output=True, text=True, timeout=120)


def test_packfs_sync_makes_unsynced_files_survive_kill9(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "commit_interval=0"):
        (mnt / "d").mkdir()
        write_file(mnt / "d" / "f", b"written, never fsynced" * 1000)
        os.sync()
        subprocess.run(["sync", "-f", str(mnt / "d" / "f")], check=True)  # syncfs(2) of the mount
        assert stats(mnt)["uncommitted_inodes"] >= 2, "sync(1) reached packfs: docs/crash-safety.md is out of date"
        flushes = stats(mnt)["device_flushes"]
        r = _sync(mnt)
        assert r.returncode == 0 and r.stdout == r.stderr == "", r
        s = stats(mnt)
        assert s["uncommitted_inodes"] == 0 and s["dirty_bytes"] == 0
        assert s["device_flushes"] > flushes
        kill9(packdir, mnt)
    with mounted(packdir, mnt):
        assert read_file(mnt / "d" / "f") == b"written, never fsynced" * 1000


def test_packfs_sync_of_something_else_fails_with_a_reason(tmp_path):
    r = _sync(tmp_path)
    assert r.returncode == 1 and r.stderr == f"packfs: {tmp_path} is not a mounted packfs\n"
