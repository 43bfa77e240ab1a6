"""Zero-message opendir: directories open without a FUSE request, listings cached by the kernel.

Every directory a Swift operation touches is opened: to list it, and to fsync it after a
change. Through pyfuse3 each open costs two round trips (OPENDIR, RELEASEDIR) and each
listing two READDIRs, ~40 us each: 8 of a 4 KiB PUT's 46 requests, 4 of a GET's 13, and
4 per directory of a replicator's walk. Kernels since 5.1 stop sending OPENDIR and
RELEASEDIR once an opendir answers ENOSYS, and then cache each listing until the
directory changes. pyfuse3 cannot use that: its readdir is given the handle opendir
returned, never the inode. The C library beside this module (_dirshim.c) rewrites the
handler table pyfuse3 gives libfuse so that opendir answers ENOSYS in C and readdir is
given the inode as its handle. Operations.opendir returns the inode as the handle too,
so the same readdir serves both ways.

The library must be in the global symbol scope before pyfuse3 binds fuse_session_new,
which it does when it is imported (Python loads extensions with RTLD_NOW): importing
this module loads it there, so the daemon imports it before pyfuse3. By itself the
library changes nothing; `enable` asks for the rewrite in the next session. If the
library is not built, or pyfuse3 was bound first, or the kernel is older than 5.1, the
mount works as before: `installed()` and `active()` say which way it went.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os


def _load() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("packfs._dirshim")
    if spec is None or spec.origin is None:
        return None
    return ctypes.CDLL(spec.origin, mode=os.RTLD_NOW | os.RTLD_GLOBAL)


_lib = _load()


def enable(on: bool) -> None:
    """Ask for zero-message opendir in the next FUSE session (call before pyfuse3.init)."""
    if _lib is not None:
        _lib.packfs_dirshim_enable(int(on))


def installed() -> bool:
    """Whether the last FUSE session made got the rewritten handler table."""
    return _lib is not None and bool(_lib.packfs_dirshim_installed())


def active() -> bool:
    """Whether the last FUSE session made opens directories without a request (known once
    the kernel's INIT was answered: the kernel must support it)."""
    return _lib is not None and bool(_lib.packfs_dirshim_active())
