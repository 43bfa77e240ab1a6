"""busy_poll_us on a real mount: the loop polls after requests by default, never with 0."""
from __future__ import annotations

import os
import subprocess
import time

from fsutil import write_file
from mounts import PACKFS, mounted, stats


def _turns(mnt) -> int:
    return stats(mnt)["busy_poll_turns"]


def _windows(mnt) -> tuple[int, int]:
    s = stats(mnt)
    return s["busy_poll_caught"], s["busy_poll_expired"]


def _stat_loop(mnt) -> None:
    """200 requests that reach the daemon (the kernel caches no xattrs) while the store is
    idle: the file is made durable first, so no appender work keeps the loop from polling
    (it failed once in a full run: the appender was still writing the file's record)."""
    write_file(mnt / "f", b"x", fsync=True)
    for _ in range(200):
        os.stat(mnt / "f")
        assert os.listxattr(mnt / "f") == []


def test_the_default_polls_after_requests(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as m:
        _stat_loop(m)
        assert _turns(m) > 0
        caught, expired = _windows(m)
        assert caught > 0  # the loop's next listxattr came within a window
        os.listxattr(m / "f")  # a request after which none comes (`stats` sends none)
        time.sleep(0.01)
        assert _windows(m)[1] > expired


def test_zero_turns_busy_polling_off(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt", "busy_poll_us=0") as m:
        _stat_loop(m)
        assert _turns(m) == 0
        assert _windows(m) == (0, 0)


def test_a_negative_window_is_refused(tmp_path, packdir):
    p = subprocess.run([*PACKFS, "mount", str(packdir), str(tmp_path / "mnt"), "-o", "busy_poll_us=-1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "busy_poll_us" in p.stderr
