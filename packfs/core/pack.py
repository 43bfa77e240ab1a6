"""A pack directory on the backing disk: its layout, initialisation and opening.

    PACKDIR/packfs.json     format version and pack id; written last at initialisation
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


def read_marker(path: str) -> dict:
    marker = os.path.join(path, MARKER)
    try:
        with open(marker) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise PackError(f"{path} is not a packfs pack directory (no {MARKER})") from None
    except (OSError, ValueError) as e:
        raise PackError(f"{marker} is unreadable: {e}") from None
    if info.get("format") not in READABLE_FORMATS:
        raise PackError(f"{path} has packfs format {info.get('format')}; this packfs reads formats "
                        f"{', '.join(map(str, READABLE_FORMATS))}")
    return info


def initialise(path: str, disk: Disk) -> None:
    """Make an empty or missing directory a pack; refuse anything else."""
    os.makedirs(path, exist_ok=True)
    if os.listdir(path):
        if os.path.exists(os.path.join(path, MARKER)):
            return
        raise PackError(f"{path} is not empty and not a packfs pack directory; refusing to write into it")
    pack_id = secrets.randbits(32)
    os.mkdir(os.path.join(path, "volumes"))
    catalog = Catalog(os.path.join(path, "catalog.sqlite"), create=True)
    catalog.initialise(pack_id)
    ns = Namespace.fresh(os.getuid(), os.getgid())
    from .journal import snapshot
    rows, removed, dirents, refs = snapshot(ns, ns.take_journal_changes())
    catalog.checkpoint(rows, removed, dirents, refs, {})
    catalog.close()
    _write_marker(path, {"format": FORMAT_VERSION, "pack_id": pack_id, "created": time.time()}, disk)


def _write_marker(path: str, info: dict, disk: Disk) -> None:
    """Replace the marker atomically and durably."""
    tmp = os.path.join(path, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, MARKER))
    disk.fsync_dir(path)


def lock(path: str) -> int:
    """Hold the pack's lock for the life of the daemon; fail if another holds it."""
    fd = os.open(os.path.join(path, "daemon.pid"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PackError(f"{path} is in use by another packfs daemon") from None
    return fd


def write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def open_pack(path: str, disk: Disk, volume_size: int, cache_bytes: int, xattrs_in_memory: bool = True) -> Pack:
    """Load the catalog and replay the journal; the caller holds the lock."""
    info = read_marker(path)
    try:
        catalog = Catalog(os.path.join(path, "catalog.sqlite"))
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
    volumes = Volumes(disk, os.path.join(path, "volumes"), info["pack_id"], volume_size, cache_bytes)
    s = catalog.settings
    # Punches the last run made after its checkpoint may have been lost in a crash.
    volumes.punch_now(catalog.dead_records(), s["volume"])
    rec = replay(ns, volumes, s["volume"], s["offset"], s["seq"])
    return Pack(path, info["pack_id"], catalog, ns, volumes, rec, "catalog" if table is None else "image", loaded)
