"""A started Filesystem of a fresh pack, without FUSE, for tests that drive the core
(or the FUSE adapter's Operations) directly."""
from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

import trio

from packfs.core import pack as packmod
from packfs.store.disk import Disk
from packfs.core.filesystem import Filesystem
from packfs.options import Options


def with_filesystem(tmp_path: Path, body: Callable[[Filesystem, trio.Nursery], Awaitable[None]],
                    xattrs_in_memory: bool = True, writeback_cache: bool = False, atime: str = "relatime") -> None:
    """Run body on a started Filesystem of a fresh pack under tmp_path (no background
    commits); close it all after. writeback_cache: the core as that mount option sets it
    up (the kernel keeps a written file's times); atime: the atime mode (Options)."""
    packmod.initialise(str(tmp_path / "pack"), Disk())
    p = packmod.open_pack(str(tmp_path / "pack"), Disk(), 1 << 30, 8 << 20, xattrs_in_memory=xattrs_in_memory)

    async def main() -> None:
        fs = Filesystem(p, Options(commit_interval=0, xattrs_in_memory=xattrs_in_memory,
                                    writeback_cache=writeback_cache, atime=atime))
        async with trio.open_nursery() as nursery:
            await fs.start(nursery)
            await body(fs, nursery)
            await fs.close()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        p.volumes.close()
        p.catalog.close()
