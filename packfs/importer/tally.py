"""What an import has copied so far: the figures of its progress lines, its summary, and
of the check that the reopened pack holds as much."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Tally:
    directories: int = 0  # the root included
    files: int = 0  # regular files: a Swift tree's objects and its few other files
    symlinks: int = 0
    specials: int = 0  # device nodes, FIFOs, sockets
    links: int = 0  # names of a file beyond its first (hard links)
    bytes: int = 0  # the regular files' sizes
    data_bytes: int = 0  # of them, data rather than holes: what the volumes hold
    target_bytes: int = 0  # the symlinks' targets (a symlink's size)
    with_xattrs: int = 0  # inodes with at least one xattr

    @property
    def inodes(self) -> int:
        return self.directories + self.files + self.symlinks + self.specials

    def line(self, seconds: float) -> str:
        """A progress line: how far, and how fast since the start."""
        rate = self.files / seconds if seconds > 0 else 0.0
        return (f"{self.files:,} files, {self.directories:,} directories, {self.data_bytes / 2**20:,.1f} MiB "
                f"in {seconds:,.0f} s ({rate:,.0f} files/s)")
