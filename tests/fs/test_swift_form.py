"""Swift's metadata through a real mount: stored in the Swift form by the C part
(packfs/swiftmeta/_swiftform.c), read back byte for byte."""
from __future__ import annotations

import hashlib
import os
import pickle
import time

from mounts import stats


def test_swifts_metadata_is_stored_small_and_reads_back_exactly(mnt):
    assert stats(mnt)["swift_form_codec"] == "c"
    files = 50
    written = {}
    for i in range(files):
        meta = pickle.dumps({b"name": b"/AUTH_test/c/o%d" % i, b"X-Timestamp": b"1763872345.%05d" % i,
                             b"Content-Type": b"application/octet-stream", b"ETag": hashlib.md5(b"%d" % i).hexdigest().encode(),
                             b"Content-Length": b"4096", b"X-Object-Meta-\xc3\xa9t\xc3\xa9": b"\xff" * (i % 3)}, 2)
        f = mnt / f"{i}.data"
        fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"x" * 4096)
            os.setxattr(fd, "user.swift.metadata", meta)
            os.setxattr(fd, "user.swift.metadata_checksum", hashlib.md5(meta).hexdigest().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        written[f] = meta
    # The compressor stores the blobs (~450 B plain, held apart until then) in the xattr arena.
    deadline = time.monotonic() + 20
    while stats(mnt)["arena_bytes"]["xattrs"] < files * 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    stored = stats(mnt)["arena_bytes"]["xattrs"]
    assert files * 32 <= stored < files * 128, "not stored in the Swift form"
    for f, meta in written.items():
        assert os.getxattr(f, "user.swift.metadata") == meta
        assert os.getxattr(f, "user.swift.metadata_checksum") == hashlib.md5(meta).hexdigest().encode()
        assert sorted(os.listxattr(f)) == ["user.swift.metadata", "user.swift.metadata_checksum"]
