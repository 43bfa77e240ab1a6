"""A pack directory on the backing disk: its layout, initialisation and opening.

    PACKDIR/packfs.json     format version and pack id; written last at initialisation
    PACKDIR/packfs.json.importing  instead, while `packfs import` builds the pack
    PACKDIR/catalog.sqlite  the catalog (plus SQLite's -wal and -shm files)
    PACKDIR/namespace.img   after a clean unmount: the catalog's inode table, to load fast
    PACKDIR/volumes/        the volume files, NNNNNNNN.pack
    PACKDIR/daemon.pid      the mounted daemon's PID, held under an exclusive lock
    PACKDIR/packfs.log      the daemon's log
    PACKDIR/control.sock    the daemon's control socket (stats, sync)

Opening never writes into a directory that is not a packfs, or is of another format.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass

from .. import FORMAT_VERSION, READABLE_FORMATS
from ..namespace import image
from ..namespace.namespace import Namespace
from ..store.disk import Disk
from ..store.volumes import Volumes
from .catalog import Catalog, CatalogError
from .recovery import Recovery, load_namespace, replay

MARKER = "packfs.json"
# The marker's name while `packfs import` builds the pack: no mount or fsck takes the
# directory for a pack until the import has finished and renamed it to MARKER, so an
# interrupted import never passes for a pack (finish_import).
IMPORTING = MARKER + ".importing"
LOCK = "daemon.pid"
CATALOG = "catalog.sqlite"
VOLUMES = "volumes"


class PackError(Exception):
    """A pack directory that cannot be used, with a one-line reason."""


@dataclass
class Pack:
    path: str
    pack_id: int
    catalog: Catalog
    ns: Namespace
    volumes: Volumes
    recovery: Recovery
    loaded_from: str = "catalog"  # or "image": where the mount read the inode table
    load_seconds: float = 0.0

    def save_image(self) -> int:
        """Write the namespace image and name it in the catalog; its size in bytes.

        Only right after a final checkpoint, with nothing left to change the namespace:
        the image must be exactly the catalog's table.
        """
        token = image.new_token()
        size = image.save(self.path, self.ns.table, token, self.catalog.stamp)
        self.catalog.set_image_token(token)
        return size


def unfinished_import(path: str) -> bool:
    """Whether path holds a pack `packfs import` began and did not finish."""
    return os.path.exists(os.path.join(path, IMPORTING)) and not os.path.exists(os.path.join(path, MARKER))


def _unfinished(path: str) -> PackError:
    return PackError(f"{path} holds an unfinished packfs import ({IMPORTING}, no {MARKER}); "
                     "run the import again: it starts over")


def read_marker(path: str, importing: bool = False) -> dict:
    """The marker's contents; importing: the marker of an import under way (IMPORTING)."""
    marker = os.path.join(path, IMPORTING if importing else MARKER)
    try:
        with open(marker) as f:
            info = json.load(f)
    except FileNotFoundError:
        if not importing and unfinished_import(path):
            raise _unfinished(path) from None
        raise PackError(f"{path} is not a packfs pack directory (no {MARKER})") from None
    except (OSError, ValueError) as e:
        raise PackError(f"{marker} is unreadable: {e}") from None
    if info.get("format") not in READABLE_FORMATS:
        raise PackError(f"{path} has packfs format {info.get('format')}; this packfs reads formats "
                        f"{', '.join(map(str, READABLE_FORMATS))}")
    return info


def initialise(path: str, disk: Disk, importing: bool = False) -> None:
    """Make an empty or missing directory a pack; refuse anything else. importing: the
    pack `packfs import` builds, with the marker IMPORTING until finish_import."""
    os.makedirs(path, exist_ok=True)
    if set(os.listdir(path)) - {LOCK}:  # (an import holds the lock before it initialises)
        if not importing and os.path.exists(os.path.join(path, MARKER)):
            return
        if unfinished_import(path):
            raise _unfinished(path)
        raise PackError(f"{path} is not empty and not a packfs pack directory; refusing to write into it")
    pack_id = secrets.randbits(32)
    os.mkdir(os.path.join(path, VOLUMES))
    catalog = Catalog(os.path.join(path, CATALOG), create=True)
    catalog.initialise(pack_id)
    ns = Namespace.fresh(os.getuid(), os.getgid())
    from .journal import snapshot
    rows, removed, dirents, refs = snapshot(ns, ns.take_journal_changes())
    catalog.checkpoint(rows, removed, dirents, refs, {})
    catalog.close()
    _write_marker(path, {"format": FORMAT_VERSION, "pack_id": pack_id, "created": time.time()}, disk,
                  IMPORTING if importing else MARKER)


def finish_import(path: str, disk: Disk) -> None:
    """Make an imported pack a pack, atomically and durably: only once its final
    checkpoint is durable (the catalog commits synchronously)."""
    os.rename(os.path.join(path, IMPORTING), os.path.join(path, MARKER))
    disk.fsync_dir(path)


def discard_unfinished_import(path: str) -> None:
    """Remove what an unfinished import left in path, so that it can start over: the
    files of a pack and nothing else (anything else is refused, and all is kept). The
    caller holds the lock, whose file stays; the marker goes last, so a crash in between
    leaves an unfinished import still."""
    names = set(os.listdir(path))
    known = {MARKER + ".tmp", IMPORTING + ".tmp", LOCK, CATALOG, CATALOG + "-wal", CATALOG + "-shm",
             CATALOG + "-journal", image.FILENAME, image.FILENAME + ".tmp", VOLUMES, "packfs.log"}
    volumes = os.path.join(path, VOLUMES)
    packs = os.listdir(volumes) if os.path.isdir(volumes) else []
    strange = sorted(names - known - {IMPORTING}) + [os.path.join(VOLUMES, n) for n in sorted(packs)
                                                      if not (n.endswith(".pack") and n[:-5].isdigit())]
    if strange:
        raise PackError(f"{path} holds an unfinished packfs import, but also {strange[0]}; refusing to clear it")
    for n in packs:
        os.unlink(os.path.join(volumes, n))
    for n in sorted(names & known - {LOCK}):
        if n == VOLUMES:
            os.rmdir(volumes)
        else:
            os.unlink(os.path.join(path, n))
    os.unlink(os.path.join(path, IMPORTING))


def _write_marker(path: str, info: dict, disk: Disk, name: str = MARKER) -> None:
    """Replace the marker atomically and durably."""
    tmp = os.path.join(path, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, name))
    disk.fsync_dir(path)


def lock(path: str) -> int:
    """Hold the pack's lock for the life of the daemon; fail if another holds it."""
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PackError(f"{path} is in use by another packfs daemon") from None
    return fd


def write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def open_pack(path: str, disk: Disk, volume_size: int, cache_bytes: int, xattrs_in_memory: bool = True,
              importing: bool = False) -> Pack:
    """Load the catalog and replay the journal; the caller holds the lock. importing: the
    pack of an import under way (see initialise)."""
    info = read_marker(path, importing)
    try:
        catalog = Catalog(os.path.join(path, CATALOG))
    except CatalogError as e:
        raise PackError(str(e)) from None
    if catalog.settings.get("pack_id") != info["pack_id"]:
        raise PackError(f"{path}: the catalog belongs to another pack")
    # Older formats are subsets of this one: upgrading is only saying so, the catalog
    # first (a crash in between leaves a pack that upgrades again).
    catalog.upgrade()
    if info["format"] != FORMAT_VERSION:
        _write_marker(path, {**info, "format": FORMAT_VERSION}, disk)
    started = time.monotonic()
    table = image.take(path, catalog.image_token, catalog.stamp, xattrs_in_memory)
    ns = load_namespace(catalog, xattrs_in_memory, table)
    if table is None:
        # No usable image: make sure the one the catalog may name is never read.
        if catalog.image_token:
            catalog.set_image_token(None)
        image.discard(path)
    # A usable image stays named until this mount's first checkpoint changes the
    # catalog (Catalog.checkpoint forgets it): a crash before then recovers from it too.
    loaded = time.monotonic() - started
    volumes = Volumes(disk, os.path.join(path, VOLUMES), info["pack_id"], volume_size, cache_bytes)
    ns.table.read_trailer = volumes.read_trailer
    s = catalog.settings
    # Punches the last run made after its checkpoint may have been lost in a crash.
    volumes.punch_now(catalog.dead_records(), s["volume"])
    rec = replay(ns, volumes, s["volume"], s["offset"], s["seq"])
    return Pack(path, info["pack_id"], catalog, ns, volumes, rec, "catalog" if table is None else "image", loaded)
