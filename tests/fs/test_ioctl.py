"""ioctl on a real mount: refused as before, and counted.

pyfuse3 has no ioctl handler, and the kernel keeps no refusal for ioctls: every one is
a FUSE request. Python's open() sends one for every file it opens buffered (the TCGETS
of its isatty check), so each Swift GET, PUT and DELETE sends one or two. The fuse shim
refuses them itself and counts them, so `make bench`'s table of requests per operation
has them too.
"""
from __future__ import annotations

import errno
import fcntl
import os
import termios

import pytest

from fsutil import write_file
from mounts import mounted, requests_received, stats


def test_an_ioctl_is_refused_with_enotty_and_counted(mnt):
    write_file(mnt / "f", b"data")
    assert stats(mnt)["ioctls_counted"] is True
    before = stats(mnt)["ioctls_answered_in_shim"]
    fd = os.open(mnt / "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as refused:
            fcntl.ioctl(fd, termios.TCGETS, bytes(64))
        assert refused.value.errno == errno.ENOTTY
        assert not os.isatty(fd)
    finally:
        os.close(fd)
    assert stats(mnt)["ioctls_answered_in_shim"] - before == 2


def test_pythons_buffered_open_sends_one_ioctl_and_an_unbuffered_one_none(mnt):
    write_file(mnt / "f", b"data")
    before = requests_received(mnt)
    with open(mnt / "f", "rb") as f:
        assert f.read() == b"data"
    middle = requests_received(mnt)
    with open(mnt / "f", "rb", buffering=0) as f:
        assert f.read() == b"data"
    after = requests_received(mnt)
    assert middle.get("ioctl", 0) - before.get("ioctl", 0) == 1
    assert after.get("ioctl", 0) - middle.get("ioctl", 0) == 0


def test_with_every_part_of_the_shim_off_ioctls_are_refused_and_stats_says_they_are_not_counted(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "nodircache,nofilecache,noxattrcache,nofallocate,nometacache") as m:
        write_file(m / "f", b"data")
        fd = os.open(m / "f", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as refused:
                fcntl.ioctl(fd, termios.TCGETS, bytes(64))
            assert refused.value.errno == errno.ENOTTY
        finally:
            os.close(fd)
        s = stats(m)
        assert s["ioctls_counted"] is False
        assert s["ioctls_answered_in_shim"] == 0
