"""Reproduce a hole in Volumes._punch (b96e3e4): after a checkpoint, every non-active
volume with no data left is removed -- also one holding a record reserved after the
checkpoint staged and not written yet. The appender then writes through a closed
descriptor: EBADF breaks the log (EIO for ever) and that record is lost.

    .venv/bin/python tests/crash/repro_volume_removal.py    # exit 1 while the hole is there

Real worker threads: the catalog commit is held until a writer has reserved a record in
volume 1 and rolled over to volume 2, and the appender's write of that record is slowed
down, as a busy disk would.
"""
from __future__ import annotations

import errno
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

from faultdisk import FaultDisk  # noqa: E402
from packfs.core import pack as packmod  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packfs.core.filesystem import Filesystem  # noqa: E402
from packs import KiB, small_options, write_file  # noqa: E402


class SlowDisk(FaultDisk):
    slow_at: tuple[str, int] | None = None

    def pwrite(self, fd, data, offset):  # type: ignore[no-untyped-def]
        if self.slow_at and self._path(fd) == self.slow_at[0] and offset == self.slow_at[1]:
            time.sleep(0.5)
        return super().pwrite(fd, data, offset)


def main() -> int:
    root = tempfile.mkdtemp() + "/pack"
    disk = SlowDisk(root)
    opts = small_options(volume_size=256 * KiB, disk_chunk_size=64 * KiB)
    packmod.initialise(root, disk)
    result: list[str] = []

    async def run() -> None:
        pk = packmod.open_pack(root, disk, opts.volume_size, opts.cache_size)
        fs = Filesystem(pk, opts, disk)
        async with trio.open_nursery() as n:
            await fs.start(n)
            await write_file(fs, "/a", b"a" * 100_000)  # volume 1
            fs.unlink(1, b"a")
            await fs.fsync()  # every record of volume 1 is dead now
            node = fs.create(1, b"b", stat.S_IFREG | 0o644, 0, 0)
            fh = fs.open(node.ino)
            gate = threading.Event()
            orig = pk.catalog.checkpoint

            def held_catalog(*args):  # type: ignore[no-untyped-def]
                gate.wait(5)
                return orig(*args)
            pk.catalog.checkpoint = held_catalog

            async def writer() -> None:
                await trio.sleep(0.1)  # the checkpoint has staged and flushed
                disk.slow_at = ("volumes/00000001.pack", fs.volumes.tail)
                await fs.write(fh, 0, b"R" * (64 * KiB))  # R: reserved in volume 1
                await fs.write(fh, 64 * KiB, b"S" * (200 * KiB))  # rolls over to volume 2
                gate.set()
            n.start_soon(writer)
            await fs.journal.checkpoint()  # punches volume 1, finds no data, removes it
            await trio.sleep(1)
            try:
                await fs.fsync()
                result.append("ok")
            except FsError as e:
                result.append(f"fsync fails with {errno.errorcode[e.errno]}; the log is broken "
                              f"({errno.errorcode.get(fs.volumes.broken, fs.volumes.broken)})")
            n.cancel_scope.cancel()

    trio.run(run)
    if result[-1] != "ok":
        print(f"HOLE: {result[-1]}")
        return 1
    print("no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
