"""`packfs import` as an operator runs it: a tree with every kind of file on an XFS
mounted read-only (a Swift device taken offline), imported, mounted, and compared through
the mount with its source: `diff -r`, every lstat field, xattrs, link targets, link counts."""
from __future__ import annotations

import os
import re
import stat
import subprocess

import sourcetree
from fsutil import loop_ext4, loop_fs
from mounts import PACKFS, mounted, stats

MiB = 1 << 20
# What GNU diff says of two FIFOs or two sockets, equal or not: it compares no contents.
SPECIAL_NOTE = re.compile(rb"^File (.+) is a (fifo|socket) while file (.+) is a \2$")


def _import(source, packdir) -> subprocess.CompletedProcess:
    return subprocess.run([*PACKFS, "import", str(source), str(packdir)], capture_output=True, timeout=600)


def test_an_imported_xfs_tree_reads_back_as_it_was(tmp_path):
    with loop_fs(tmp_path, 512 * MiB, ["mkfs.xfs", "-q", "-f"]) as xfs:
        src = xfs / "node"
        sourcetree.build(src)
        # As for a migration: nothing may change the source, not even an access time.
        subprocess.run(["mount", "-o", "remount,ro", str(xfs)], check=True)
        want = sourcetree.records(src)
        packdir, mnt = tmp_path / "pack", tmp_path / "mnt"
        done = _import(src, packdir)
        assert done.returncode == 0, done.stderr
        assert done.stdout.count(b"\n") == 1 and b"Checked:" in done.stdout
        with mounted(packdir, mnt, "noatime"):
            assert stats(mnt)["loaded_from"] == "image"  # the import left one: the first mount loads fast
            got = sourcetree.records(mnt)
            diff = subprocess.run(["diff", "-r", "--no-dereference", str(src), str(mnt)], capture_output=True)
    assert diff.returncode in (0, 1) and not diff.stderr, diff.stderr
    assert all(SPECIAL_NOTE.match(line) for line in diff.stdout.splitlines()), diff.stdout
    assert got.keys() == want.keys()
    for path, w in want.items():
        g = dict(got[path])
        assert g.pop("blocks") <= w["blocks"] or not stat.S_ISREG(w["type"]), path  # holes stay holes
        assert g == {k: v for k, v in w.items() if k != "blocks"}, path
    assert got[b"sparse"]["blocks"] * 512 < 1 * MiB  # 12 KiB of data in 6 MiB
    assert got[b"a/linked"]["nlink"] == 3 and got[b"b/c/third name"]["group"] == b"a/linked"
    assert got[b"split-metadata"]["xattrs"].keys() == {"user.swift.metadata", "user.swift.metadata1",
                                                      "user.swift.metadata_checksum"}


def test_refusals_say_why_in_one_line_and_touch_nothing(tmp_path, packdir, mnt):
    src, full = tmp_path / "src", tmp_path / "full"
    for d in (src, full):
        d.mkdir()
        (d / "f").write_bytes(b"x")
    cases = {
        "is not a directory": (src / "f", tmp_path / "p1"),
        "is not empty": (src, full),
        "holds a pack already (mounted)": (src, packdir),  # the `mnt` fixture mounts it
    }
    for why, (source, target) in cases.items():
        before = sorted(os.listdir(target)) if os.path.isdir(target) else None
        done = _import(source, target)
        assert done.returncode == 1 and done.stdout == b""
        assert done.stderr.count(b"\n") == 1 and why.encode() in done.stderr, done.stderr
        assert (sorted(os.listdir(target)) if os.path.isdir(target) else None) == before


def test_a_full_packdir_disk_stops_it_in_one_line_and_leaves_it_unfinished(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("one", "two"):
        (src / name).write_bytes(os.urandom(24 * MiB))
    with loop_ext4(tmp_path, 64 * MiB) as disk:  # packfs keeps the last 32 MiB for its catalog
        done = _import(src, disk / "pack")
        assert done.returncode == 1 and done.stderr.count(b"\n") == 1, done.stderr
        assert b"PACKDIR's filesystem is full (at " in done.stderr, done.stderr
        assert os.path.exists(disk / "pack" / "packfs.json.importing")
        assert not os.path.exists(disk / "pack" / "packfs.json")
