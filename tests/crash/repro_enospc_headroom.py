"""Reproduce a hole in the space accounting: data is meant never to take the last
HEADROOM (32 MiB) of the backing disk, so the catalog can always checkpoint and space
can be reclaimed. But Journal.commit flushes every buffered file run under the metadata
allowance (ensure_space(wb.footprint() + BLOCK, metadata=True)), and Volumes._grow lets
metadata take the headroom (and preallocate a whole step of it). A file smaller than
disk_chunk_size -- every Swift object under 1 MiB with the default options -- reaches
the log only through a commit, so HEADROOM never applies to it: 48 KiB files written
and fsynced one by one fill a small disk to the last block.

    .venv/bin/python tests/crash/repro_enospc_headroom.py    # exit 1 while the hole is there
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultdisk import FaultDisk  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packfs.store.volumes import HEADROOM  # noqa: E402
from packs import KiB, run, small_options, write_file  # noqa: E402

MiB = 1 << 20


def main() -> int:
    root = tempfile.mkdtemp() + "/pack"
    disk = FaultDisk(root, capacity=48 * MiB)
    out: dict = {}

    async def work(fs) -> None:  # type: ignore[no-untyped-def]
        n = 0
        for i in range(2000):
            try:
                await write_file(fs, f"/f{i:03d}", bytes([i % 256]) * (48 * KiB))
                n += 1
            except FsError:
                break
        st = disk.statvfs(root)
        out["free"] = st.f_bavail * st.f_frsize
        out["data"] = n * 48 * KiB
    run(root, disk, work, opts=small_options(volume_size=4 * MiB), clean=False)
    print(f"data acknowledged {out['data'] / MiB:.1f} MiB; backing disk left free {out['free'] / MiB:.1f} MiB "
          f"(HEADROOM {HEADROOM / MiB:.0f} MiB)")
    if out["free"] < HEADROOM:
        print("HOLE: data took the headroom kept for the catalog")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
