"""What an import refuses before it writes anything, and the pack directory it takes."""
from __future__ import annotations

import os

from ..core import pack
from .errors import ImportFailed


def check_source(source: str) -> bytes:
    """SOURCE as an absolute path in bytes (names need not be UTF-8); it must be a directory,
    and the import root's: another user reads no trusted.* xattr (a listing leaves them
    out, so a copy would lack them unsaid) and not every file."""
    if os.geteuid() != 0:
        raise ImportFailed("packfs import runs as root: another user can read neither trusted.* xattrs nor "
                           "every file of SOURCE")
    if not os.path.exists(source):
        raise ImportFailed(f"SOURCE {source} does not exist")
    if not os.path.isdir(source):
        raise ImportFailed(f"SOURCE {source} is not a directory")
    return os.fsencode(os.path.realpath(source))


def take_packdir(packdir: str, source: bytes) -> tuple[int, bool]:
    """Lock PACKDIR for the import, making it if missing: (the lock's descriptor, whether
    an unfinished import was cleared from it). It must be empty, or hold only what an
    unfinished import left (which is cleared: the import starts over); a pack, mounted or
    not, and anything else is refused, and then nothing in PACKDIR is touched."""
    real = os.path.realpath(packdir)
    if os.path.exists(packdir) and not os.path.isdir(packdir):
        raise ImportFailed(f"PACKDIR {packdir} is not a directory")
    if (real + "/").startswith(os.fsdecode(source).rstrip("/") + "/"):
        raise ImportFailed(f"PACKDIR {packdir} is inside SOURCE: the import would copy itself")
    unfinished = os.path.isdir(packdir) and pack.unfinished_import(packdir)
    if os.path.isdir(packdir) and not unfinished:
        names = set(os.listdir(packdir)) - {pack.LOCK}  # (left by an import stopped before it began)
        if pack.MARKER in names:
            raise ImportFailed(f"PACKDIR {packdir} holds a pack already{' (mounted)' if _locked(packdir) else ''}; "
                               "import into an empty directory")
        if names:
            raise ImportFailed(f"PACKDIR {packdir} is not empty; import into an empty directory")
    try:
        os.makedirs(packdir, exist_ok=True)
        fd = pack.lock(packdir)
    except pack.PackError:
        raise ImportFailed(f"PACKDIR {packdir} is in use: another import, or a mount, holds its lock") from None
    except OSError as e:
        raise ImportFailed(f"cannot use PACKDIR {packdir}: {e.strerror or e}") from None
    if unfinished:
        try:
            pack.discard_unfinished_import(packdir)
        except (pack.PackError, OSError) as e:
            os.close(fd)
            raise ImportFailed(str(e)) from None
    return fd, unfinished


def _locked(packdir: str) -> bool:
    """Whether a daemon holds the pack's lock (it is mounted)."""
    try:
        fd = pack.lock(packdir)
    except (pack.PackError, OSError):
        return True
    os.close(fd)
    return False
