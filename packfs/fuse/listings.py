"""Directory listings as readdir resumes them, keyed by the offsets handed to the kernel.

A reader that starts at offset 0 gets a snapshot of the directory. Each entry's offset
carries the snapshot's number and the entry's index, so a reader resumes in the
snapshot it started in, whatever other readers of the directory do in between: with
zero-message opendir (fuseshim.py) readdir is given no handle of its own, only the
directory. The last KEEP snapshots are kept (and no more than KEEP_ENTRIES entries in all
but the newest one's), and one is dropped once read to its end (or once its last entry
went out, when the fuse shim answers the end). A reader whose snapshot
was dropped resumes at the same index of a fresh listing (under a new number), which is
exact while the directory is unchanged (the kernel, which caches listings, starts again
from 0 when a directory has changed).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

Entries = list[tuple[bytes, int]]  # (name, inode), in the namespace's order

KEEP = 256
KEEP_ENTRIES = 1 << 16  # ~6 MiB of snapshots at most, whatever readers leave unfinished
_SNAPSHOT_MAX = (1 << 31) - 1  # offsets stay below 2**63: snapshot number << 32 | index


class Listings:
    def __init__(self, listdir: Callable[[int], Entries]) -> None:
        self._listdir = listdir
        self._snapshots: OrderedDict[int, tuple[int, Entries]] = OrderedDict()
        self._entries = 0  # held in all the snapshots
        self._next = 1

    def resume(self, directory: int, offset: int) -> tuple[int, Entries, int]:
        """(snapshot number, entries, index to start at) for a readdir of `directory`
        from `offset` (0, or one this class made)."""
        number, start = offset >> 32, offset & 0xFFFF_FFFF
        kept = self._snapshots.get(number) if offset else None
        if kept is not None and kept[0] == directory:
            entries = kept[1]
            self._snapshots.move_to_end(number)
        else:
            entries = self._listdir(directory)
            number = self._next
            self._next = self._next % _SNAPSHOT_MAX + 1
            self._snapshots[number] = (directory, entries)
            self._entries += len(entries)
            while len(self._snapshots) > 1 and (len(self._snapshots) > KEEP or self._entries > KEEP_ENTRIES):
                self._entries -= len(self._snapshots.popitem(last=False)[1][1])
        if start >= len(entries):
            del self._snapshots[number]  # read to its end
            self._entries -= len(entries)
        return number, entries, start

    def finish(self, number: int) -> None:
        """Drop a snapshot whose end the kernel will hear without asking here (the fuse
        shim answers it: fuseshim.note_end)."""
        kept = self._snapshots.pop(number, None)
        if kept is not None:
            self._entries -= len(kept[1])

    @staticmethod
    def offset(number: int, index: int) -> int:
        """The offset a reader hands back to resume at `index` of snapshot `number`."""
        return number << 32 | index

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def held(self) -> int:
        """Entries held in all the snapshots."""
        return self._entries
