"""The few calls of inotify(7) that staging needs (the standard library has none)."""
from __future__ import annotations

import ctypes
import os
import struct

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_CLOSE_NOWRITE = 0x10
IN_Q_OVERFLOW = 0x4000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


class Inotify:
    """A non-blocking inotify instance: watch open files, read what happened to them."""

    def __init__(self) -> None:
        self.fd = _check(_libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))

    def watch_fd(self, fd: int, mask: int) -> int:
        """Watch the file an open descriptor names (a file with no name too): its watch id."""
        return _check(_libc.inotify_add_watch(self.fd, f"/proc/self/fd/{fd}".encode(), mask))

    def unwatch(self, wd: int) -> None:
        _libc.inotify_rm_watch(self.fd, wd)  # EINVAL once the file is gone: nothing to do

    def read(self) -> list[tuple[int, int]]:
        """The events queued now, as (watch id, mask), without waiting."""
        out = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            at = 0
            while at < len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, at)
                out.append((wd, mask))
                at += _EVENT.size + length

    def close(self) -> None:
        os.close(self.fd)
