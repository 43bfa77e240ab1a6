"""How much each device flush shares: the commits, files and log writes it made durable.

Group commit is the log's answer to concurrent fsyncs (volumes.py): whatever arrived
while a write and flush were in flight goes out in the next one. These counts show
how well that works under a real load, where a mean alone would hide the lone flushes
that dominate on a hard disk.
"""
from __future__ import annotations

from typing import Iterable

_CAP = 1024  # larger samples are counted as this


class SmallCounts:
    """A distribution of small non-negative integers: mean and p99 without keeping samples."""

    __slots__ = ("hist", "n", "total")

    def __init__(self) -> None:
        self.hist: dict[int, int] = {}
        self.n = 0
        self.total = 0

    def add(self, value: int) -> None:
        self.n += 1
        self.total += value
        key = min(value, _CAP)
        self.hist[key] = self.hist.get(key, 0) + 1

    def quantile(self, q: float) -> int:
        seen = 0
        for value in sorted(self.hist):
            seen += self.hist[value]
            if seen >= q * self.n:
                return value
        return 0

    def report(self) -> dict:
        return {"mean": round(self.total / self.n, 2) if self.n else 0, "p99": self.quantile(0.99)}


class GroupCommits:
    """Per device flush: the commits (records asking for durability), the files whose data
    it carried and the log writes it took, since the flush before it."""

    def __init__(self) -> None:
        self.commits = SmallCounts()
        self.files = SmallCounts()
        self.writes = SmallCounts()
        self._commits = 0
        self._files: set[int] = set()
        self._writes = 0

    def written(self, records: Iterable[tuple[int, bool]], writes: int, flushes: int) -> None:
        """A batch the log writer finished: its records as (file, asked for durability)
        (file 0 for the log's own records) and the writes and flushes it took."""
        for ino, sync in records:
            self._commits += sync
            if ino:
                self._files.add(ino)
        self._writes += writes
        if flushes:
            self.commits.add(self._commits)
            self.files.add(len(self._files))
            self.writes.add(self._writes)
            self._commits, self._writes = 0, 0
            self._files.clear()

    def report(self) -> dict:
        return {"flushes": self.commits.n, "commits_per_flush": self.commits.report(),
                "files_per_flush": self.files.report(), "writes_per_flush": self.writes.report()}
