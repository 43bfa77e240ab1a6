"""The reader process: walks SOURCE (walk.py) beside the builder and sends it the items.

An import is bound by the CPU of one core; reading the source is about a fifth of the
work, and a second process does it on the second core. It is forked (not started
afresh) before the pack is opened and the event loop runs, so it costs a few
milliseconds and shares the code already loaded; it closes every descriptor it
inherited but its end of the pipe (PACKDIR's lock among them). It
sends batches of items over a pipe, each a frame: a 4-byte length and the batch
marshal'd. The last frame holds None when the walk is done, or the one-line reason it
stopped (an ImportFailed's message). The pipe is the backpressure: a reader ahead of the
builder waits in write(), holding at most the pipe's capacity and one batch.

The builder's process kills the reader (by its PID) unless it saw the walk through, and
always reaps it. A reader whose builder died gets EPIPE at its next write and exits.
"""
from __future__ import annotations

import fcntl
import gc
import marshal
import os
import signal
from typing import AsyncIterator, Iterator

import trio

from .errors import ImportFailed
from . import walk
from .walk import NODE, PIECE, Item

# A batch is sent once it holds this many items or this many bytes of data.
BATCH_ITEMS = 512
BATCH_BYTES = 256 * 1024
PIPE_BYTES = 1 << 20  # the pipe's capacity asked for (F_SETPIPE_SZ); the kernel's 64 KiB if refused
_F_SETPIPE_SZ = 1031
_LENGTH = 4


class Reader:
    """The reader process of one import, walking root; close() it whatever happens."""

    def __init__(self, root: bytes, piece: int) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass
        try:
            self.pid = os.fork()
        except OSError as e:
            os.close(r)
            os.close(w)
            raise ImportFailed(f"cannot start the process reading SOURCE: {e.strerror}") from None
        if self.pid == 0:  # (the reader process: it never returns)
            _serve(root, piece, r, w)
        os.close(w)
        os.set_blocking(r, False)
        self.fd = r
        self._done = False

    async def batches(self) -> AsyncIterator[list[Item]]:
        """The walk's items, a batch at a time. Raises ImportFailed if the walk stopped: with
        its reason, or, if the process died without one, with how it ended."""
        buf = bytearray()
        while True:
            while len(buf) >= _LENGTH:
                end = _LENGTH + int.from_bytes(buf[:_LENGTH], "little")
                if len(buf) < end:
                    break
                batch = marshal.loads(memoryview(buf)[_LENGTH:end])
                del buf[:end]
                if batch is None:
                    self._done = True
                    return
                if isinstance(batch, str):
                    raise ImportFailed(batch)
                yield batch
            try:
                chunk = os.read(self.fd, PIPE_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                continue
            if not chunk:
                raise ImportFailed(f"the process reading SOURCE stopped: {self._ended()}")
            buf += chunk

    def _ended(self) -> str:
        """How the reader process ended (reaping it)."""
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(status)}, without saying why"

    def close(self) -> None:
        """Reap the reader process; kill it first unless it finished its walk."""
        if self.pid:
            if not self._done:
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _serve(root: bytes, piece: int, r: int, w: int) -> None:
    """The reader process's whole life: walk, send, exit (never through the parent's
    cleanup: atexit handlers, buffered output, finally blocks up the stack)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the builder, which kills this
        gc.disable()  # tuples of bytes and ints: no cycles
        os.close(r)
        os.closerange(3, w)  # the parent's (PACKDIR's lock among them): a reader keeps none
        os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
        try:
            for batch in _batched(walk.items(root, piece)):
                _send(w, batch)
            _send(w, None)
            code = 0
        except ImportFailed as e:
            _send(w, str(e))
        except BrokenPipeError:
            pass  # the builder is gone
        except Exception as e:  # a bug: say it in one line all the same
            _send(w, f"the process reading SOURCE failed: {type(e).__name__}: {e}")
    except BaseException:
        pass
    finally:
        os._exit(code)


def _batched(stream: Iterator[Item]) -> Iterator[list[Item]]:
    batch: list[Item] = []
    size = 0
    for item in stream:
        batch.append(item)
        size += _data_bytes(item)
        if len(batch) >= BATCH_ITEMS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _data_bytes(item: Item) -> int:
    """At most how many bytes of data an item carries: a piece's, or an inline file's."""
    if item[0] == PIECE:
        return len(item[2])
    if item[0] == NODE and isinstance(item[11], list):
        return item[6]
    return 0


def _send(w: int, batch: object) -> None:
    data = marshal.dumps(batch)
    view = memoryview(len(data).to_bytes(_LENGTH, "little") + data)
    while view:
        view = view[os.write(w, view):]
