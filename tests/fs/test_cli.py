"""The command line as an operator meets it: what `stats` says of its daemon, one line and
a status instead of a traceback, quiet into a closed pipe, and refusals by design counted
apart from errors (docs/stats.md)."""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from fsutil import raises_errno
from mounts import PACKFS, daemon_pid, force_unmount, is_mounted, kill_daemon, mounted, stats

import packfs

# A POSIX ACL equal to mode 0644 (struct posix_acl_xattr_header, then USER_OBJ, GROUP_OBJ,
# OTHER entries), as setfacl and cp -a hand it to setxattr.
ACL_0644 = bytes.fromhex("02000000" "01000600ffffffff" "04000400ffffffff" "20000400ffffffff")


def _run(*args: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([*PACKFS, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


def test_stats_names_the_daemon_its_pack_and_version(mnt, packdir):
    s = stats(mnt)
    assert s["pid"] == daemon_pid(packdir)
    assert (s["pack_directory"], s["mountpoint"]) == (str(packdir), str(mnt))
    assert s["version"] == packfs.__version__
    text = _run("stats", str(mnt)).stdout
    assert f"{s['pid']}   packfs {packfs.__version__}, {packdir} at {mnt}" in text


def test_stats_of_a_dead_mount_is_one_line_and_status_1(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        try:
            kill_daemon(packdir)
            assert is_mounted(mnt)
            p = _run("stats", str(mnt))
            assert p.returncode == 1, p
            assert p.stderr.startswith("packfs: ") and len(p.stderr.splitlines()) == 1, p.stderr
            assert "has died" in p.stderr and "Traceback" not in p.stderr
        finally:
            force_unmount(mnt, packdir)


def test_stats_into_a_closed_pipe_ends_quietly(mnt):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = _run("stats", str(mnt), "--json", stdout=write_end)
    finally:
        os.close(write_end)
    assert (p.returncode, p.stderr) == (141, "")


def test_fsck_of_a_missing_directory_says_so(tmp_path):
    p = _run("fsck", str(tmp_path / "nowhere"))
    assert p.returncode == 2
    assert p.stdout.strip() == f"packfs fsck {tmp_path / 'nowhere'}: not checked: {tmp_path / 'nowhere'} does not exist"
    assert not (tmp_path / "nowhere").exists()


def test_posix_acls_are_refused_by_design_not_errors(mnt, tmp_path):
    """cp -a tries to copy every file's POSIX ACL; packfs answers EOPNOTSUPP by design."""
    (mnt / "f").write_bytes(b"x")
    with raises_errno(errno.EOPNOTSUPP):
        os.setxattr(mnt / "f", "system.posix_acl_access", ACL_0644)
    before = stats(mnt)["operations"]["setxattr"]
    assert (before["count"], before["errors"], before["refused"]) == (1, 0, 1)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / name).write_bytes(name.encode())
    subprocess.run(["cp", "-a", str(src), str(mnt / "copy")], check=True, capture_output=True)
    assert sorted(os.listdir(mnt / "copy")) == ["a", "b", "c"]
    setxattr = stats(mnt)["operations"]["setxattr"]
    assert setxattr["refused"] > 1 and setxattr["errors"] == 0, setxattr  # cp's attempts: one per file, at least
    assert "refused" in _run("stats", str(mnt)).stdout.splitlines()[-1]
