"""The one exception the core raises: an errno for the FUSE adapter to return."""
from __future__ import annotations

import errno as _errno
import os


class FsError(Exception):
    """A POSIX error a Linux filesystem would give; the adapter maps it to FUSEError."""

    def __init__(self, errno: int, detail: str = "") -> None:
        super().__init__(errno, detail or os.strerror(errno))
        self.errno = errno


def enoent() -> FsError:
    return FsError(_errno.ENOENT)
