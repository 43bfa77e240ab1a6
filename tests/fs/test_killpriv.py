"""Set-ID bits and file capabilities through a real mount: a write, truncate or chown
takes them as on ext4, and with HANDLE_KILLPRIV_V2 (fuseshim.py) the kernel's cached
write path no longer asks getxattr("security.capability") before every write()."""
from __future__ import annotations

import os
import stat

import pytest

from fsutil import as_user, write_file
from mounts import mounted, requests_received, stats

MODES = ["", "writeback_cache,nodirect_writes"]


def _kernel_has_killpriv_v2() -> bool:
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 12)


@pytest.mark.parametrize("options", MODES)
def test_writes_and_truncates_by_another_user_take_set_id_bits(tmp_path, options):
    with mounted(tmp_path / "pack", tmp_path / "mnt", options) as m:
        for name in ("w", "a", "t", "root", "noexec"):
            write_file(m / name, b"x")
            os.chmod(m / name, 0o6777)
        os.chmod(m / "noexec", 0o6766)  # set-group-ID without group execute: not a privilege
        as_user(m, """
            fd = os.open("w", os.O_WRONLY); os.write(fd, b"yy"); os.close(fd)
            fd = os.open("noexec", os.O_WRONLY); os.write(fd, b"yy"); os.close(fd)
            with open("a", "ab") as f:
                f.write(b"zz")
            os.truncate("t", 0)
        """)
        with open(m / "root", "r+b") as f:
            f.write(b"r")
        modes = {n: stat.S_IMODE(os.stat(m / n).st_mode) for n in ("w", "a", "t", "root", "noexec")}
        assert modes == {"w": 0o777, "a": 0o777, "t": 0o777, "root": 0o6777, "noexec": 0o2766}
        os.chown(m / "root", 1000, 1000)  # a chown takes them even when root asks
        assert stat.S_IMODE(os.stat(m / "root").st_mode) == 0o777
    with mounted(tmp_path / "pack", tmp_path / "mnt", options) as m:  # and they stay taken
        assert stat.S_IMODE(os.stat(m / "w").st_mode) == 0o777


@pytest.mark.skipif(not _kernel_has_killpriv_v2(), reason="HANDLE_KILLPRIV_V2 needs Linux 5.12")
def test_a_cached_stream_asks_for_capabilities_once(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "writeback_cache,nodirect_writes") as m:
        assert stats(m)["killpriv_v2"] is True
        before = requests_received(m)
        data = os.urandom(64 << 10)
        with open(m / "stream", "wb") as f:
            for _ in range(64):
                f.write(data)
            os.fsync(f.fileno())
        after = requests_received(m)
        assert after.get("getxattr", 0) - before.get("getxattr", 0) <= 1
        assert 0 < after["write"] - before.get("write", 0) < 64  # the kernel gathered the 64 KiB writes
        assert (m / "stream").read_bytes() == data * 64
