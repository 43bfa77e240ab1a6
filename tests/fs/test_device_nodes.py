"""dev / nodev, suid / nosuid, exec / noexec: the kernel's per-mount flags, nodev and
nosuid by default as libfuse mounts, each passed on when asked for."""
from __future__ import annotations

import errno
import os
import stat
import subprocess

from fsutil import raises_errno
from mounts import mounted

NULL = os.makedev(1, 3)  # /dev/null's numbers


def _flags(mnt) -> set[str]:
    with open("/proc/mounts") as f:
        return next(set(line.split()[3].split(",")) for line in f if line.split()[1] == str(mnt))


def test_a_device_node_opens_with_dev(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "dev"):
        assert "nodev" not in _flags(mnt) and "nosuid" in _flags(mnt)
        os.mknod(mnt / "null", 0o666 | stat.S_IFCHR, NULL)
        st = os.stat(mnt / "null")
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == NULL
        fd = os.open(mnt / "null", os.O_RDWR)
        try:
            assert os.write(fd, b"gone") == 4
            assert os.read(fd, 10) == b""
        finally:
            os.close(fd)
    with mounted(packdir, mnt):  # nodev by default: the same node cannot be opened
        assert "nodev" in _flags(mnt)
        assert os.stat(mnt / "null").st_rdev == NULL
        with raises_errno(errno.EACCES):
            os.open(mnt / "null", os.O_RDWR)


def test_suid_and_noexec(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "suid,noexec"):
        assert "nosuid" not in _flags(mnt) and "noexec" in _flags(mnt)
        script = mnt / "run"
        script.write_text("#!/bin/sh\necho ran\n")
        script.chmod(0o755)
        with raises_errno(errno.EACCES):
            subprocess.run([str(script)], check=True)
    with mounted(packdir, mnt):
        assert "nosuid" in _flags(mnt) and "noexec" not in _flags(mnt)
        assert subprocess.run([str(mnt / "run")], check=True, capture_output=True, text=True).stdout == "ran\n"
