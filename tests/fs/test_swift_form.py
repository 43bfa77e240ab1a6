"""Swift's metadata through a real mount: stored in the Swift form by the C part
(packfs/swiftmeta/_swiftform.c), read back byte for byte."""
from __future__ import annotations

import hashlib
import os
import pickle

from mounts import mounted, stats


def test_swifts_metadata_is_stored_small_and_reads_back_exactly(tmp_path):
    """With the values in memory (xattrs_in_memory: by default a checkpoint lets a Swift
    object's go to its record), the xattr arena holds them in the Swift form. The
    background compressor leaves the blobs set in its last turns plain until later
    commits, so the arena is measured after a remount: the unmount's checkpoint
    compresses every blob still waiting."""
    written = {}
    with mounted(tmp_path / "pack", tmp_path / "mnt", "xattrs_in_memory") as mnt:
        assert stats(mnt)["swift_form_codec"] == "c"
        for i in range(50):
            meta = pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1763872345.%05d" % i,
                                 b"Content-Type": b"application/octet-stream",
                                 b"ETag": hashlib.md5(b"%d" % i).hexdigest().encode(), b"Content-Length": b"4096",
                                 b"X-Object-Meta-\xc3\xa9t\xc3\xa9": b"\xff" * (i % 3)}, 2)
            name = f"{i}.data"
            fd = os.open(mnt / name, os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                os.write(fd, b"x" * 4096)
                os.setxattr(fd, "user.swift.metadata", meta)
                os.setxattr(fd, "user.swift.metadata_checksum", hashlib.md5(meta).hexdigest().encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            written[name] = meta
        _read_back(mnt, written)
    with mounted(tmp_path / "pack", tmp_path / "mnt", "xattrs_in_memory") as mnt:
        s = stats(mnt)
        assert s["xattr_values_in_memory"] == len(written)
        stored = s["arena_bytes"]["xattrs"]
        assert len(written) * 32 <= stored < len(written) * 128, "not stored in the Swift form"
        _read_back(mnt, written)


def _read_back(mnt, written: dict[str, bytes]) -> None:
    for name, meta in written.items():
        f = mnt / name
        assert os.getxattr(f, "user.swift.metadata") == meta
        assert os.getxattr(f, "user.swift.metadata_checksum") == hashlib.md5(meta).hexdigest().encode()
        assert sorted(os.listxattr(f)) == ["user.swift.metadata", "user.swift.metadata_checksum"]
