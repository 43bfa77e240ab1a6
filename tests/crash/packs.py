"""Helpers for the crash, I/O-error and fsck tests: run a Filesystem on a pack (no FUSE),
make files by path, and read the whole tree back."""
from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

from packfs.core import pack as packmod  # noqa: E402
from packfs.store.disk import Disk  # noqa: E402
from packfs.errors import FsError  # noqa: E402
from packfs.core.filesystem import Filesystem  # noqa: E402
from packfs.namespace.namespace import ROOT  # noqa: E402
from packfs.options import Options  # noqa: E402

KiB = 1 << 10


def by_the_appender(*_: Any) -> bool:
    """A FaultDisk `when`: only the appender's own calls (a commit's flush), not the
    background preallocator's flushes of zeros."""
    return threading.current_thread().name == "packfs-appender"


def small_options(**kw: Any) -> Options:
    o = Options()
    o.disk_chunk_size = 64 * KiB
    o.max_dirty = 1 << 20
    o.volume_size = 1 << 20
    o.checkpoint_bytes = 1 << 40
    o.cache_size = 0
    o.commit_interval = 0  # what a test leaves uncommitted stays so, however slow the machine
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def run(root: str | os.PathLike, disk: Disk, fn: Callable[[Filesystem], Awaitable[Any]],
        opts: Options | None = None, clean: bool = True) -> Any:
    """Open (initialising if needed) the pack at root on disk, run fn(fs) inside trio, close.

    clean=False stops without the final checkpoint and without stopping anything
    gracefully: the state an unclean stop leaves (what was flushed stays flushed).
    """
    root = str(root)
    opts = opts or small_options()
    packmod.initialise(root, disk)
    result: dict[str, Any] = {}

    async def main() -> None:
        pk = packmod.open_pack(root, disk, opts.volume_size, opts.cache_size)
        fs = Filesystem(pk, opts, disk)
        try:
            async with trio.open_nursery() as nursery:
                await fs.start(nursery)
                result["value"] = await fn(fs)
                if clean:
                    await fs.close()
                nursery.cancel_scope.cancel()
        finally:
            pk.volumes.close()
            pk.catalog.close()

    trio.run(main)
    return result.get("value")


def lookup(fs: Filesystem, path: str) -> int | None:
    ino = ROOT
    for part in [p for p in path.split("/") if p]:
        node = fs.lookup(ino, part.encode())
        if node is None:
            return None
        ino = node.ino
    return ino


def mkdirs(fs: Filesystem, path: str) -> int:
    ino = ROOT
    for part in [p for p in path.split("/") if p]:
        node = fs.lookup(ino, part.encode())
        if node is None:
            node = fs.create(ino, part.encode(), stat.S_IFDIR | 0o755, 0, 0)
        ino = node.ino
    return ino


async def write_file(fs: Filesystem, path: str, data: bytes, fsync: bool = True,
                     xattrs: dict[bytes, bytes] | None = None) -> int:
    d, _, name = path.rstrip("/").rpartition("/")
    parent = mkdirs(fs, d)
    node = fs.lookup(parent, name.encode())
    if node is None:
        node = fs.create(parent, name.encode(), stat.S_IFREG | 0o644, 0, 0)
    fh = fs.open(node.ino, truncate=True)
    try:
        for pos in range(0, len(data), 64 * KiB):
            await fs.write(fh, pos, data[pos:pos + 64 * KiB])
        for k, v in (xattrs or {}).items():
            fs.setxattr(node.ino, k, v)
        if fsync:
            await fs.fsync()
    finally:
        await fs.release(fh)
    return node.ino


async def read_file(fs: Filesystem, path: str) -> bytes:
    ino = lookup(fs, path)
    if ino is None:
        raise FileNotFoundError(path)
    fh = fs.open(ino)
    try:
        return await fs.read(fh, 0, fs.getattr(ino).size + 1)
    finally:
        await fs.release(fh)


async def tree(fs: Filesystem) -> dict[str, Any]:
    """path -> bytes for files (or the FsError errno if unreadable), None for directories; xattrs under 'path@'."""
    out: dict[str, Any] = {}
    stack = [(ROOT, "")]
    while stack:
        ino, prefix = stack.pop()
        for name, child in sorted(fs.ns.listdir(ino)):
            path = prefix + "/" + name.decode()
            node = fs.getattr(child)
            if node.is_dir:
                out[path] = None
                stack.append((child, path))
                continue
            try:
                out[path] = await read_file(fs, path)
            except FsError as e:
                out[path] = e.errno
            x = {n: await fs.getxattr(child, n) for n in await fs.listxattr(child)}
            if x:
                out[path + "@"] = x
    return out
