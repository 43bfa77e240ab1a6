"""The SQLite catalog: checkpoints of the inode table, loaded at mount.

A checkpoint writes only what changed since the previous one, in one transaction,
together with the log position it reflects; the journal records after that position
are replayed at mount (see recovery.py). WAL mode with synchronous=FULL makes each
checkpoint durable when its transaction commits.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

import apsw

from .. import FORMAT_VERSION, READABLE_FORMATS
from ..namespace import image
from ..namespace.inoderow import InodeRow
from ..namespace.xattrstore import IN_CATALOG, IN_RECORD, IN_RECORD_ROW

SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inodes (
    ino INTEGER PRIMARY KEY, mode INTEGER, uid INTEGER, gid INTEGER, nlink INTEGER,
    size INTEGER, atime INTEGER, mtime INTEGER, ctime INTEGER, rdev INTEGER,
    target BLOB, xattrs BLOB, extents BLOB, parent INTEGER);
CREATE TABLE IF NOT EXISTS dirents (
    parent INTEGER, name BLOB, ino INTEGER, PRIMARY KEY (parent, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_records (
    volume INTEGER, offset INTEGER, length INTEGER, PRIMARY KEY (volume, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shared_records (
    volume INTEGER, offset INTEGER, length INTEGER, refs INTEGER,
    PRIMARY KEY (volume, offset)) WITHOUT ROWID;
"""


# Page cache of each xattr reader: SQLite's default, 2 MiB, was held per connection and
# counted in the daemon's RSS per file; a point read finds what it misses in the kernel's.
READER_CACHE_KIB = 256


class CatalogError(Exception):
    """The catalog is missing, damaged or of another format."""


class Catalog:
    def __init__(self, path: str, create: bool = False, readonly: bool = False) -> None:
        """readonly: open it as it is, writing nothing (fsck's check of a pack or image)."""
        if readonly:
            flags = apsw.SQLITE_OPEN_READONLY
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
        self.path = path  # (a worker thread must not ask self.db: another may be using it)
        self._readers: list[apsw.Connection] = []  # read-only connections not in use (xattrs_of)
        try:
            self.db = apsw.Connection(path, flags=flags)
            if readonly:
                self._readers.append(self.db)  # xattrs_of may read through it
            else:
                # One pragma per execute: apsw stops a multi-statement execute at the first row.
                self.db.execute("PRAGMA journal_mode=WAL").fetchall()
                self.db.execute("PRAGMA synchronous=FULL").fetchall()
                self.db.execute(SCHEMA)  # IF NOT EXISTS: also adds tables newer than the pack
            self.settings = dict(self.db.execute("SELECT key, value FROM settings"))
        except apsw.Error as e:
            raise CatalogError(f"catalog {path} is damaged: {e}") from e
        if not create and self.settings.get("format") not in READABLE_FORMATS:
            raise CatalogError(f"catalog {path} has format {self.settings.get('format')}, this packfs "
                               f"reads formats {', '.join(map(str, READABLE_FORMATS))}")

    def close(self) -> None:
        for reader in self._readers:
            if reader is not self.db:
                reader.close()
        self.db.close()

    @contextlib.contextmanager
    def _transaction(self, settings: dict) -> Iterator[None]:
        """One transaction that ends by writing `settings`, begun and committed by statements.

        Not apsw's `with connection`: its COMMIT holds the GIL, and a checkpoint's commit
        (the WAL's writes and fsyncs, and the copy back into the database) held the event
        loop's thread 77-89 ms at 200,000 rows. A statement's step lets go of it.
        `self.settings` changes only once the commit did.
        """
        self.db.execute("BEGIN")
        try:
            yield
            self.db.executemany("INSERT OR REPLACE INTO settings VALUES (?, ?)", settings.items())
            self.db.execute("COMMIT")
        except BaseException:
            if not self.db.get_autocommit():  # a failed COMMIT may have rolled back already
                self.db.execute("ROLLBACK")
            raise
        self.settings.update(settings)

    def _put(self, settings: dict) -> None:
        with self._transaction(settings):
            pass

    def initialise(self, pack_id: int) -> None:
        self._put({"format": FORMAT_VERSION, "pack_id": pack_id, "volume": 1, "offset": 0,
                   "seq": 1, "next_ino": 2})

    def upgrade(self) -> None:
        """Mark an older (readable) format as the current one: the current reads both."""
        if self.settings.get("format") != FORMAT_VERSION:
            self._put({"format": FORMAT_VERSION})

    @property
    def image_token(self) -> int | None:
        """The token of the namespace image that matches this catalog, if one does (image.py)."""
        return self.settings.get("image")

    @property
    def stamp(self) -> tuple[int, int, int, int]:
        """The checkpoint position and next_ino: any checkpoint that changed something changed these."""
        s = self.settings
        return s["volume"], s["offset"], s["seq"], s["next_ino"]

    def set_image_token(self, token: int | None) -> None:
        self._put({"image": token})

    def inode_rows(self, xattrs: bool = True) -> Iterator[InodeRow]:
        """Every inode row; without xattrs, where they are in their place: 0 none, 1 here
        (IN_CATALOG: see xattrs_of), 2 in the file's record (IN_RECORD)."""
        where = (f"CASE WHEN xattrs IS NULL THEN 0 WHEN xattrs = x'{IN_RECORD_ROW.hex()}' THEN {IN_RECORD} "
                 f"ELSE {IN_CATALOG} END")
        return self.db.execute("SELECT ino, mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, target, "
                               f"{'xattrs' if xattrs else where}, extents, parent FROM inodes")

    def xattrs_of(self, ino: int) -> bytes | None:
        """One inode's packed xattrs as of the last checkpoint; from any thread.

        Read through a connection of its own: under WAL it never waits for a checkpoint
        being written on the first (from a worker thread) and sees the last one committed.
        Each concurrent caller takes its own from a pool (a connection serves one thread at
        a time; list pop and append are atomic under the GIL).
        """
        try:
            reader = self._readers.pop()
        except IndexError:
            reader = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READONLY)
            reader.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}").fetchall()
        try:
            # fetchall ends the statement, and the read transaction with it, before returning.
            rows = reader.execute("SELECT xattrs FROM inodes WHERE ino = ?", (ino,)).fetchall()
        finally:
            self._readers.append(reader)
        return rows[0][0] if rows else None

    def top_ino(self) -> int:
        """The largest inode number in the checkpoint (0 if none)."""
        return self.db.execute("SELECT max(ino) FROM inodes").fetchall()[0][0] or 0

    def dirents(self) -> Iterator[tuple[int, bytes, int]]:
        return self.db.execute("SELECT parent, name, ino FROM dirents ORDER BY parent")  # the key's order: no sort

    def dead_records(self) -> list[tuple[int, int, int]]:
        return self.db.execute("SELECT volume, offset, length FROM dead_records").fetchall()

    def shared_records(self) -> Iterator[tuple[int, int, int, int]]:
        return self.db.execute("SELECT volume, offset, length, refs FROM shared_records")

    def checkpoint(self, rows: Iterable[InodeRow], removed: Iterable[int],
                   dirents: Iterable[tuple[int, bytes, int | None]],
                   refs: Iterable[tuple[tuple[int, int, int], int]], settings: dict,
                   dead: Iterable[tuple[int, int, int]] = ()) -> None:
        """Write one checkpoint in one transaction. May block: run it off the event loop.

        `dead` lists the records this checkpoint lets the caller punch; they stay listed
        until the next checkpoint, so a punch lost in a crash is redone at mount.
        Any namespace image stops matching the catalog: its token goes, and then its file.
        """
        had_image = self.image_token is not None
        with self._transaction({**settings, "image": None}):
            self.db.execute("DELETE FROM dead_records")
            self.db.executemany("INSERT OR REPLACE INTO dead_records VALUES (?,?,?)", dead)
            self.db.executemany(
                "INSERT OR REPLACE INTO inodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            self.db.executemany("DELETE FROM inodes WHERE ino = ?", ((i,) for i in removed))
            for parent, name, ino in dirents:
                if ino is None:
                    self.db.execute("DELETE FROM dirents WHERE parent = ? AND name = ?", (parent, name))
                else:
                    self.db.execute("INSERT OR REPLACE INTO dirents VALUES (?,?,?)", (parent, name, ino))
            for (vol, off, length), count in refs:
                if count > 1:
                    self.db.execute("INSERT OR REPLACE INTO shared_records VALUES (?,?,?,?)",
                                    (vol, off, length, count))
                else:
                    self.db.execute("DELETE FROM shared_records WHERE volume = ? AND offset = ?", (vol, off))
        if had_image:
            image.discard(os.path.dirname(self.path))

    def counts(self) -> tuple[int, int]:
        inodes = self.db.execute("SELECT count(*) FROM inodes").fetchall()[0][0]
        dirents = self.db.execute("SELECT count(*) FROM dirents").fetchall()[0][0]
        return inodes, dirents
