"""Reproduce a hole in Volumes._roll_over (b96e3e4): the old volume is truncated to the
tail it had *before* awaiting the creation of the new volume, so records another task
reserved in the old volume meanwhile -- a concurrent commit's data and META -- are cut
off after they were written and flushed. The fsync returned; the file then reads EIO.

    .venv/bin/python tests/crash/repro_rollover_trim.py     # exit 1 while the hole is there

Two tasks at once, near the end of a volume: one writes enough to roll over, the other
commits. Trio's scheduler is seeded (campaign.deterministic), so the interleaving is
reproducible; a few seeds and delays are tried.
"""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

import campaign  # noqa: E402
from faultdisk import FaultDisk  # noqa: E402
from packfs.core import pack as packmod  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packfs.core.filesystem import Filesystem  # noqa: E402
from packs import KiB, write_file  # noqa: E402


def attempt(seed: int, delay: int) -> str:
    root = tempfile.mkdtemp() + "/pack"
    disk = FaultDisk(root)
    opts = campaign.options(0)  # 384 KiB volumes, 16 KiB chunks
    packmod.initialise(root, disk)
    out: list[str] = []

    async def main() -> None:
        pk = packmod.open_pack(root, disk, opts.volume_size, opts.cache_size)
        fs = Filesystem(pk, opts, disk)
        async with trio.open_nursery() as n:
            await fs.start(n)
            await write_file(fs, "/fill", os.urandom(300 * KiB))
            a = fs.create(1, b"a", stat.S_IFREG | 0o644, 0, 0)
            fa = fs.open(a.ino)
            b = fs.create(1, b"b", stat.S_IFREG | 0o644, 0, 0)
            fb = fs.open(b.ino)
            await fs.write(fa, 0, b"A" * 5000)

            async def commit_a() -> None:
                for _ in range(delay):
                    await trio.lowlevel.checkpoint()
                await fs.fsync()
                out.append("acked")

            async def big_b() -> None:
                await fs.write(fb, 0, os.urandom(100 * KiB))  # rolls over to volume 2

            async with trio.open_nursery() as m:
                m.start_soon(big_b)
                m.start_soon(commit_a)
            try:
                got = await fs.read(fa, 0, 5000)
                out.append("ok" if got == b"A" * 5000 else "wrong bytes")
            except FsError as e:
                out.append(f"EIO reading a file whose fsync returned ({e})")
            n.cancel_scope.cancel()

    with campaign.deterministic(seed):
        trio.run(main)
    return out[-1]


def main() -> int:
    for seed in range(1, 9):
        for delay in range(4):
            result = attempt(seed, delay)
            if result != "ok":
                print(f"HOLE (seed {seed}, delay {delay}): {result}")
                return 1
    print("no failure in 32 interleavings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
