"""metacache on a real mount: a fresh mount's lookups (of names there and not), getattrs,
whole listings, a file's first getxattr and its reads of a whole record in the page cache
are answered by the fuse shim from the inode table, reach no Python handler and are
counted in `packfs stats`; with nometacache they all reach Python."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from mounts import mounted, requests_served, stats

from packfs.fuse import fuseshim

pytestmark = pytest.mark.skipif(not fuseshim.loaded(), reason="the fuse shim library is not built")


def _touch_tree(m: Path) -> os.stat_result:
    """A fresh mount's first stat of a path (3 lookups), a missing name, a listing and a stat again."""
    first = os.stat(m / "a" / "b" / "f")
    assert not os.path.exists(m / "a" / "nope")
    assert sorted(os.listdir(m / "a" / "b")) == ["f", "g"]
    again = os.stat(m / "a" / "b" / "f")  # (attr_timeout=0: a GETATTR)
    assert (first.st_ino, first.st_size, first.st_mtime_ns) == (again.st_ino, again.st_size, again.st_mtime_ns)
    return first


def test_answered_in_c_and_not_with_the_option_off(tmp_path: Path) -> None:
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    with mounted(pack, mnt) as m:
        os.makedirs(m / "a" / "b")
        (m / "a" / "b" / "f").write_bytes(b"x" * 10)
        (m / "a" / "b" / "g").write_bytes(b"")
        made = os.stat(m / "a" / "b" / "f")
    with mounted(pack, mnt, "metacache,noatime,attr_timeout=0") as m:
        before = requests_served(m)
        st = _touch_tree(m)
        after, s = requests_served(m), stats(m)
        assert s["metadata_from_shim"]
        assert s["lookups_answered_in_shim"] >= 3 and s["negative_lookups_answered_in_shim"] >= 1
        assert s["listings_answered_in_shim"] >= 1 and s["getattrs_answered_in_shim"] >= 1
        for op in ("lookup", "getattr", "readdir"):
            assert after.get(op, 0) == before.get(op, 0), op
    assert (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns) == (made.st_ino, made.st_size, made.st_mode,
                                                                    made.st_mtime_ns)
    with mounted(pack, mnt, "nometacache,noatime,attr_timeout=0") as m:
        before = requests_served(m)
        _touch_tree(m)
        after, s = requests_served(m), stats(m)
        assert not s["metadata_from_shim"]
        assert s["lookups_answered_in_shim"] == s["getattrs_answered_in_shim"] == s["listings_answered_in_shim"] == 0
        assert after["lookup"] - before.get("lookup", 0) >= 3 and after["readdir"] > before.get("readdir", 0)


def _get(path: Path) -> bytes:
    """A Swift GET's file part: open, its metadata xattrs, read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = os.getxattr(fd, "user.swift.metadata")
        assert os.getxattr(fd, "user.swift.metadata_checksum") == b"c" * 32
        return meta + os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def test_a_get_reads_its_xattrs_and_data_in_c(tmp_path: Path) -> None:
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    data = {f"o{i}": os.urandom(4096 + i) for i in range(20)}
    with mounted(pack, mnt) as m:
        for name, body in data.items():
            (m / name).write_bytes(body)
            os.setxattr(m / name, "user.swift.metadata", b"meta-" + name.encode())
            os.setxattr(m / name, "user.swift.metadata_checksum", b"c" * 32)
        os.sync()
    for options, in_c in (("metacache,noatime", True), ("nometacache,noatime", False)):
        with mounted(pack, mnt, options) as m:
            before = requests_served(m)
            for name, body in data.items():
                assert _get(m / name) == b"meta-" + name.encode() + body, name
            after, s = requests_served(m), stats(m)
        python = {op: after.get(op, 0) - before.get(op, 0) for op in ("getxattr", "read")}
        if in_c:
            assert python == {"getxattr": 0, "read": 0}, python
            assert s["reads_answered_in_shim"] >= len(data) and s["xattrs_answered_in_shim"] >= 2 * len(data)
            assert s["prefetches_in_shim"] == len(data) and s["prefetches"] == 0
        else:
            assert python["getxattr"] == python["read"] == len(data), python
            assert s["reads_answered_in_shim"] == s["prefetches_in_shim"] == 0 and s["prefetches"] == len(data)
