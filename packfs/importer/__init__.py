"""packfs import: build a pack from an existing directory tree, without FUSE.

Operators use it to move a Swift device onto packfs (stop the servers, mount the XFS
read-only elsewhere, import its tree into an empty PACKDIR, mount the pack at the old
mount point); benchmarks, to build large trees without a mount's round trips. It makes
the tree through the core (Filesystem) and writes no on-disk format itself, so it keeps
working when the inode table or the format change; of the import the core knows only
its marker (pack.IMPORTING). A second process, forked at the start, reads SOURCE on the
other core and streams what it read to the one that builds (reader.py).

1. Refuse what it must (preflight.py): SOURCE not a directory, PACKDIR not empty, a
   pack, mounted, or inside SOURCE. Take PACKDIR's lock for the whole run.
2. Initialise the pack with its marker named packfs.json.importing: no mount or fsck
   takes the directory for a pack while it is built, or after an interrupted import.
3. Walk SOURCE in the reader process (walk.py, reading through source.py) and make
   every inode as its items come (build.py), with background checkpoints; then the
   final checkpoint, the one durable commit.
4. Reopen the pack as a mount would and compare it with what was made (verify.py);
   write the namespace image, so the first mount loads fast.
5. Rename the marker to packfs.json: from here on it is a pack.

An interrupted import (a signal, a crash, a full disk) leaves PACKDIR with
packfs.json.importing: mount and fsck refuse it with a line saying so, and running the
same `packfs import` again clears it and starts over. There is no resume.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import apsw
import trio

from ..core import pack
from ..core.filesystem import Filesystem
from ..core.journal import collector_paused
from ..errors import FsError
from ..options import Options
from ..progress import QUIET, Progress
from ..store.disk import Disk
from .build import TreeBuilder
from .errors import ImportFailed
from .preflight import check_source, take_packdir
from .reader import Reader
from .tally import Tally
from .verify import differences

__all__ = ["ImportFailed", "Imported", "run_import"]

# No timer commits (the final checkpoint is the one durable commit) and no access times
# to keep; xattrs into the records that can carry them (a Swift object's metadata: the
# table a mount loads keeps only that they are there), and out of memory once
# checkpointed; the rest as a mount's defaults, which shape the records (disk_chunk_size).
OPTIONS = Options(commit_interval=0, atime="noatime", xattrs_in_memory=False)


@dataclass
class Imported:
    """What an import did, for its summary."""
    source: str
    packdir: str
    tally: Tally
    build_seconds: float  # the tree made and checkpointed: durable
    seconds: float  # and the check and the namespace image
    volume_bytes: int  # the disk space the volumes take
    restarted: bool  # an unfinished import was cleared first

    def summary(self) -> str:
        """One paragraph: what was imported, how fast, and that it was checked."""
        t = self.tally
        rate = t.files / self.build_seconds if self.build_seconds else 0.0
        cleared = " An unfinished earlier import was cleared first." if self.restarted else ""
        return (f"packfs import: {self.source} -> {self.packdir}: {t.files:,} files ({t.links:,} more names by "
                f"hard links), {t.directories:,} directories, {t.symlinks:,} symlinks, {t.specials:,} device nodes, "
                f"FIFOs and sockets; {t.bytes / 2**20:,.1f} MiB in files, {t.data_bytes / 2**20:,.1f} MiB of it "
                f"data (the rest holes); {t.with_xattrs:,} inodes with xattrs. Imported and checkpointed in "
                f"{self.build_seconds:,.2f} s ({rate:,.0f} files/s), {self.seconds:,.2f} s with the check and the "
                f"namespace image; the volumes take {self.volume_bytes / 2**20:,.1f} MiB of disk. Checked: the pack, "
                f"reopened as a mount opens it, holds as many inodes of each type, names, bytes and xattrs as were "
                f"imported.{cleared} Mount it with `packfs mount {self.packdir} MOUNTPOINT`.")


def run_import(source: str, packdir: str, progress: Progress = QUIET, disk: Disk | None = None) -> Imported:
    """Import the tree under source into the empty (or missing) directory packdir.
    Raises ImportFailed, with one line saying why, if it refuses or cannot finish."""
    started = time.monotonic()
    root = check_source(source)
    packdir = os.path.abspath(packdir)
    disk = disk or Disk()
    lock_fd, restarted = take_packdir(packdir, root)
    try:
        tally = _build_pack(root, packdir, disk, progress)
        build_seconds = time.monotonic() - started
        progress.step("checking the pack")
        volume_bytes = _check(packdir, disk, tally)
        pack.finish_import(packdir, disk)
    finally:
        os.close(lock_fd)
    return Imported(os.fsdecode(root), packdir, tally, build_seconds, time.monotonic() - started, volume_bytes,
                    restarted)


def _build_pack(root: bytes, packdir: str, disk: Disk, progress: Progress) -> Tally:
    """Initialise the pack (as an import's), make the tree in it and checkpoint it. The
    reader process starts first, so it reads while the pack is made."""
    reader = Reader(root, OPTIONS.disk_chunk_size)
    try:
        try:
            pack.initialise(packdir, disk, importing=True)
            p = pack.open_pack(packdir, disk, OPTIONS.volume_size, OPTIONS.cache_size, importing=True,
                               xattrs_in_memory=OPTIONS.xattrs_in_memory)
        except (pack.PackError, OSError) as e:
            raise ImportFailed(f"cannot make a pack in {packdir}: {e}") from None
        try:
            with collector_paused():  # it makes no reference cycles, and millions of objects
                return trio.run(_build, p, root, reader, progress)
        except BaseExceptionGroup as group:  # (a trio nursery's, around the one that stopped the import)
            raise _written_off(_only(group)) from None
        except (FsError, OSError, apsw.Error) as e:
            raise _written_off(e) from None
        finally:
            p.volumes.close()
            p.catalog.close()
    finally:
        reader.close()


def _only(e: BaseException) -> BaseException:
    """The one exception in a group of one (nested or not), or the group."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e


def _written_off(e: BaseException) -> BaseException:
    """A failure to write the pack (its disk full or failing: the log, a checkpoint) as an
    ImportFailed; anything else as it is."""
    if isinstance(e, FsError):
        return ImportFailed(f"cannot write the pack: {os.strerror(e.errno)}")
    if isinstance(e, (OSError, apsw.Error)):
        return ImportFailed(f"cannot write the pack: {e}")
    return e


async def _build(p: pack.Pack, root: bytes, reader: Reader, progress: Progress) -> Tally:
    """Make the tree in the pack, then its final checkpoint.

    Of the background tasks a mount runs only the log writer: no committer (nothing is
    made durable until the end), and no preallocator, so the log takes its space with
    fallocate as it grows instead of writing zeros ahead of itself.
    """
    fs = Filesystem(p, OPTIONS)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fs.volumes.run)
        builder = TreeBuilder(fs, nursery, progress)
        tally = await builder.build(root, reader)
        progress.step(f"{builder.status()}; writing the final checkpoint")
        await fs.close()
        nursery.cancel_scope.cancel()
    return tally


def _check(packdir: str, disk: Disk, made: Tally) -> int:
    """Reopen the pack, compare it with what was made, and leave it a namespace image;
    the disk space its volumes take. It opens the pack with a default mount's
    xattrs_in_memory, so that such a mount can load the image."""
    try:
        p = pack.open_pack(packdir, disk, OPTIONS.volume_size, OPTIONS.cache_size, importing=True,
                           xattrs_in_memory=Options().xattrs_in_memory)
    except (pack.PackError, OSError) as e:
        raise ImportFailed(f"the imported pack does not open: {e}") from None
    try:
        wrong = differences(p, made)
        if wrong:
            raise ImportFailed("the reopened pack differs from what was imported: " + "; ".join(wrong))
        p.save_image()
        return sum(disk.allocated_bytes(p.volumes.fd(n)) for n in p.volumes.existing())
    finally:
        p.volumes.close()
        p.catalog.close()
