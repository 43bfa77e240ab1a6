"""drain on a real mount: queued requests are read without a wait by default, never with 0."""
from __future__ import annotations

import os
import subprocess
import threading

from fsutil import write_file
from mounts import PACKFS, mounted, stats


def _concurrent_requests(mnt, threads: int = 8, each: int = 300) -> None:
    """Requests from several threads at once, so that some wait in /dev/fuse while the
    daemon serves others (listxattr: the kernel caches no xattrs, each one reaches it)."""
    write_file(mnt / "f", b"x", fsync=True)
    failures = []

    def ask() -> None:
        try:
            for _ in range(each):
                assert os.listxattr(mnt / "f") == []
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            failures.append(e)

    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert failures == []


def test_the_default_reads_queued_requests_without_waiting(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt") as m:
        _concurrent_requests(m)
        assert stats(m)["fuse_waits_skipped"] > 0
        shown = subprocess.run([*PACKFS, "stats", str(m)], check=True, capture_output=True, text=True).stdout
        assert "requests read without a wait (drain)" in shown


def test_drain_zero_without_busy_polling_always_waits(tmp_path, packdir):
    """(With busy polling, drain=0 still reads a request that came while the loop polled.)"""
    with mounted(packdir, tmp_path / "mnt", "drain=0,busy_poll_us=0") as m:
        _concurrent_requests(m)
        assert stats(m)["fuse_waits_skipped"] == 0


def test_a_negative_drain_is_refused(tmp_path, packdir):
    p = subprocess.run([*PACKFS, "mount", str(packdir), str(tmp_path / "mnt"), "-o", "drain=-1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "drain" in p.stderr
