"""Reproduce: after a write() fails with ENOSPC, every fsync and fsyncdir fails with
ENOSPC too -- even for metadata only -- until the failed file is unlinked.

WriteBehind.write puts the bytes into the file's buffer (and grows its size) before
ensure_space raises, so the failed write stays applied and buffered. Since 138b1c0 a
commit flushes buffered data under the data allowance (which keeps HEADROOM), so no
commit can succeed while those bytes are buffered on a full disk.
(tests/fs/test_enospc.py::test_enospc_mount_stays_usable_and_freed_space_returns
shows the same on a real mount: fsync of a directory after ENOSPC.)

    .venv/bin/python tests/crash/repro_enospc_buffered_write.py   # exit 1 while the hole is there

Fix: a write that gets ENOSPC must leave the file as it was (ensure space before
changing the buffer, or undo), as POSIX says of a failed write.
"""
from __future__ import annotations

import errno
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultdisk import FaultDisk  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packs import KiB, lookup, run, small_options, write_file  # noqa: E402

MiB = 1 << 20


def main() -> int:
    root = tempfile.mkdtemp() + "/pack"
    disk = FaultDisk(root, capacity=48 * MiB)
    out: list[str] = []

    async def work(fs) -> None:  # type: ignore[no-untyped-def]
        for i in range(200):
            try:
                await write_file(fs, f"/f{i:03d}", bytes([i % 256]) * (512 * KiB))
            except FsError:
                break
        fs.setxattr(lookup(fs, "/f000"), b"user.after", b"1")
        try:
            await fs.fsync()
            out.append("ok")
        except FsError as e:
            out.append(f"a metadata-only fsync after ENOSPC fails with {errno.errorcode[e.errno]} "
                       f"({fs.wb.dirty_bytes} bytes of the failed write still buffered)")
    run(root, disk, work, opts=small_options(volume_size=64 * MiB), clean=False)
    if out[-1] != "ok":
        print(f"HOLE: {out[-1]}")
        return 1
    print("no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
