"""What changed in the namespace: since the last commit, and since the last checkpoint.

A commit logs a snapshot of every inode, directory entry and shared-record count that
changed since the previous one (`Changes`: sets, a few hundred or thousand entries). A
checkpoint writes to the catalog what every commit since the previous checkpoint changed
(`PendingChanges`: up to 200,000 changed inodes). Kept as sets, that was ~250 B of small
Python objects per changed inode and its entry (47 MB at 186,805, measured in a daemon
after a 200,000-object build), made all through the build and freed at once by the
checkpoint; whatever else was made among them then kept pymalloc's arenas from going back
to the kernel (100 arenas of 1 MiB held for 12 MB of live objects). So the pending changes
are packed: 4 B an inode, 5 B and the name an entry, once per commit that changed them.
"""
from __future__ import annotations

from array import array
from typing import Iterator

from ..store import extents as ext
from . import varint


class Changes:
    """What changed since someone last took it: inodes, directory entries, record refs."""

    __slots__ = ("inodes", "dirents", "refs")

    def __init__(self) -> None:
        self.inodes: set[int] = set()
        self.dirents: set[tuple[int, bytes]] = set()
        self.refs: set[ext.RecordKey] = set()

    def __bool__(self) -> bool:
        return bool(self.inodes or self.dirents or self.refs)

    def update(self, other: Changes) -> None:
        """Take another's changes too."""
        self.inodes |= other.inodes
        self.dirents |= other.dirents
        self.refs |= other.refs

    def parts(self, size: int) -> Iterator[Changes]:
        """These changes in parts of at most `size` inodes and `size` entries (the shared
        records in the first)."""
        inodes, dirents = list(self.inodes), list(self.dirents)
        for start in range(0, max(len(inodes), len(dirents), 1), size):
            part = Changes()
            part.inodes = set(inodes[start:start + size])
            part.dirents = set(dirents[start:start + size])
            if not start:
                part.refs = set(self.refs)
            yield part


class PendingChanges:
    """Every commit's Changes since the last checkpoint, appended packed; `changes()`
    gives them back as one Changes, `parts()` as several. Inode numbers are below 2**32
    (inodes.INO_MAX)."""

    __slots__ = ("inodes", "parents", "names", "refs")

    def __init__(self) -> None:
        self.inodes = array("I")  # changed inodes, once per commit that changed them
        self.parents = array("I")  # the changed entries' directories, ...
        self.names = bytearray()  # ... and their names, each behind its length (LEB128)
        self.refs: set[ext.RecordKey] = set()  # shared records are rare: a set is small

    def __bool__(self) -> bool:
        return bool(self.inodes or self.parents or self.refs)

    @property
    def inode_count(self) -> int:
        """Changed inodes, counted once per commit that changed them (at least the distinct ones)."""
        return len(self.inodes)

    def merge(self, changes: Changes) -> None:
        self.inodes.extend(changes.inodes)
        names = self.names
        for parent, name in changes.dirents:
            self.parents.append(parent)
            names += varint.encode(len(name))
            names += name
        self.refs |= changes.refs

    def extend(self, other: PendingChanges) -> None:
        """Take another's changes too (a failed checkpoint gives back what it took)."""
        self.inodes.extend(other.inodes)
        self.parents.extend(other.parents)
        self.names += other.names
        self.refs |= other.refs

    def changes(self) -> Changes:
        """All of them, each once."""
        return next(self.parts(len(self.inodes) + len(self.parents) + 1))

    def parts(self, size: int) -> Iterator[Changes]:
        """All of them, each once, in parts made of at most `size` of the inodes and `size`
        of the entries as appended (the shared records in the first): a checkpoint takes
        one part per turn of the event loop, ~2 ms of unpacking for 2,000 and 2,000."""
        inodes, parents = self.inodes, self.parents
        names, pos = bytes(self.names), 0
        seen_inodes: set[int] = set()
        seen: set[tuple[int, bytes]] = set()
        for start in range(0, max(len(inodes), len(parents), 1), size):
            part = Changes()
            part.inodes = set(inodes[start:start + size]) - seen_inodes
            seen_inodes |= part.inodes
            dirents = part.dirents
            for parent in parents[start:start + size]:
                n = names[pos]
                if n < 0x80:  # a name shorter than 128 bytes: its length in one byte
                    pos += 1
                else:
                    n, pos = varint.decode(names, pos)
                key = (parent, names[pos:pos + n])
                pos += n
                if key not in seen:
                    seen.add(key)
                    dirents.add(key)
            if not start:
                part.refs = set(self.refs)
            yield part
