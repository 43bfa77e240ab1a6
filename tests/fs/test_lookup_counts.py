"""The kernel's references to an inode (FUSE lookup counts), through a real mount.

The kernel takes one reference more each time it looks a name up again after the
entry's timeout, so a long-lived directory's count keeps growing: packfs's u8 column
widens past 255 (inodes.InodeTable.set_lookups). The count must stay exact, or a file
unlinked while the kernel holds it would go too early or never.
"""
from __future__ import annotations

import os
import time

from fsutil import write_file
from mounts import mounted, stats

REVALIDATIONS = 300


def test_counts_past_255_widen_the_column_and_stay_exact(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, "entry_timeout=0"):
        write_file(mnt / "f", b"x" * 5000, fsync=True)
        base = stats(mnt)["inodes"]
        for _ in range(REVALIDATIONS):  # each one a LOOKUP: the entry timed out at once
            os.stat(mnt / "f")
        log = (packdir / "packfs.log").read_text()
        assert "lookups: a count of 256: the column is H from now on" in log
        fd = os.open(mnt / "f", os.O_RDONLY)
        try:
            os.unlink(mnt / "f")
            s = stats(mnt)
            assert s["unlinked_in_use"] == {"open": 0, "kernel_only": 1} and s["inodes"] == base
            assert os.pread(fd, 5000, 0) == b"x" * 5000  # still held: the count did not reach 0
        finally:
            os.close(fd)
        deadline = time.monotonic() + 10
        while (s := stats(mnt))["unlinked_in_use"]["kernel_only"]:  # the kernel's FORGET gives back all
            assert time.monotonic() < deadline, f"an unlinked file the kernel let go is still held: {s}"
            time.sleep(0.1)
        assert s["inodes"] == base - 1
