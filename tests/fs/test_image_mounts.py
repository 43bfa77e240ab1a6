"""The namespace image through real mounts: a clean unmount leaves one, mounts read it
until a checkpoint changes the catalog, and a mount from the image shows exactly what a
mount from the catalog shows."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from fsutil import fsync_dir, read_file, snapshot_tree, write_file
from mounts import PACKFS, kill9, mounted
from test_bulk import _build_tree

from packfs.fuse import control
from packfs.namespace import image
from packfs.core import pack


def loaded_from(packdir: Path) -> str:
    return control.request(pack.read_marker(str(packdir))["pack_id"], "stats")["loaded_from"]


def test_image_and_catalog_mounts_show_the_same_tree(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    img = packdir / image.FILENAME
    with mounted(packdir, mnt, "noatime"):  # (snapshot_tree)
        assert loaded_from(packdir) == "catalog"
        _build_tree(mnt)
        before = snapshot_tree(mnt)
    assert img.exists()
    assert "namespace image written" in (packdir / "packfs.log").read_text()
    with mounted(packdir, mnt, "noatime"):
        assert loaded_from(packdir) == "image"
        assert img.exists()  # the catalog has not changed yet: the image still matches it
        shown = subprocess.run([*PACKFS, "stats", str(mnt)], check=True, capture_output=True, text=True).stdout
        assert "inode table from the image" in shown
        assert re.search(r"arenas +[\d.]+ (B|KiB) +of names \([\d.]+ (B|KiB) free\); [\d.]+ (B|KiB) of xattrs", shown)
        # The tree's utime'd files have times far from their mtimes, kept beside the columns.
        assert re.search(r"inode columns +[\d.]+ (B|KiB|MiB) +\([\d,]+ inodes; times far from their mtime: "
                         r"atime [1-9][\d,]*, ctime [1-9][\d,]*\)", shown)
        assert snapshot_tree(mnt) == before
        assert control.request(pack.read_marker(str(packdir))["pack_id"], "sync") == {"ok": True}
        assert not img.exists()  # a checkpoint changed the catalog: the image went with its token
    img.unlink()  # the catalog names an image that is gone: the mount loads the catalog
    with mounted(packdir, mnt, "noatime"):
        assert loaded_from(packdir) == "catalog"
        assert snapshot_tree(mnt) == before
    assert "namespace image not used" in (packdir / "packfs.log").read_text()


@pytest.mark.parametrize("checkpointed", [False, True])
def test_crash_after_an_image_mount_loses_nothing(tmp_path, packdir, checkpointed):
    """kill -9 before the mount's first checkpoint: recovery starts from the image; after
    it: from the catalog. Either way every fsync'd change is there."""
    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt):
        write_file(mnt / "kept", b"k" * 5000, fsync=True)
        write_file(mnt / "doomed", b"d", fsync=True)
    with mounted(packdir, mnt):
        assert loaded_from(packdir) == "image"
        os.makedirs(mnt / "objects" / "1")
        if checkpointed:
            assert control.request(pack.read_marker(str(packdir))["pack_id"], "sync") == {"ok": True}
        write_file(mnt / "objects" / "1" / "new.data", b"n" * 70_000, fsync=True)
        os.unlink(mnt / "doomed")
        fsync_dir(mnt / "objects" / "1")
        fsync_dir(mnt)
        kill9(packdir, mnt)
    assert (packdir / image.FILENAME).exists() != checkpointed
    with mounted(packdir, mnt):
        assert loaded_from(packdir) == ("catalog" if checkpointed else "image")
        assert read_file(mnt / "objects" / "1" / "new.data") == b"n" * 70_000
        assert read_file(mnt / "kept") == b"k" * 5000
        assert sorted(os.listdir(mnt)) == ["kept", "objects"]
