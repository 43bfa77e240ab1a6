"""How pyfuse3's request tasks take turns at /dev/fuse: drain the queue before yielding.

pyfuse3 runs a few request tasks. Each takes a trio Lock, waits in epoll for /dev/fuse
to be readable, lets go of the lock, reads one request and serves it. Per request that
is a lock hand-off to the next task (a task switch, plus the checkpoint trio's Lock
takes even when it is free) and an epoll re-arm and wait, whether or not more requests
are already waiting in the kernel. With a zero-work pyfuse3 filesystem and 4 threads
calling listxattr, that machinery was most of the ~70 us of daemon CPU per request
(measured); see ../shared/FUSE-COSTS.md.

pyfuse3 reaches trio only through its module attribute `trio` (its asyncio mode swaps
it the same way), and its loop needs only `Lock` and `lowlevel.wait_readable` for this.
`install` gives it stand-ins for those two:

- `Turn`, the read lock, takes no checkpoint when free and hands nothing off: a task
  that served a request without blocking takes its turn again at once. A release wakes
  one waiting task, which takes the turn only if it is still free (the task that
  released it may be blocked in its handler: then the woken task reads the next
  request).
- `wait_readable` asks poll(0) first: if a request is already queued, it returns
  without going through epoll or the scheduler, at most `streak` times in a row; then
  it waits the normal way, which lets every other trio task (the store's, the control
  socket's) run.

With `streak` 0 nothing is installed and pyfuse3 uses trio itself.
"""
from __future__ import annotations

import select
import types

import pyfuse3
import trio


class Turn:
    """pyfuse3's read lock: free to take again without a task switch."""

    def __init__(self) -> None:
        self._held = False
        self._waiting = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        while self._held:
            await self._waiting.park()
        self._held = True

    async def __aexit__(self, *exc: object) -> None:
        self._held = False
        if self._waiting:
            self._waiting.unpark()


class Drain:
    """`wait_readable` for pyfuse3: no epoll round while requests are queued."""

    def __init__(self, streak: int) -> None:
        self.streak = streak
        self.run = 0  # requests read in a row without yielding
        self.skipped = 0  # waits answered by poll(0) (`packfs stats`: fuse_waits_skipped)
        self._polls: dict[int, select.poll] = {}

    async def wait_readable(self, fd: int) -> None:
        poll = self._polls.get(fd)
        if poll is None:
            poll = self._polls[fd] = select.poll()
            poll.register(fd, select.POLLIN)
        if self.run < self.streak and poll.poll(0):
            self.run += 1
            self.skipped += 1
            return
        self.run = 0
        await trio.lowlevel.wait_readable(fd)


def install(streak: int) -> Drain | None:
    """Give pyfuse3 the stand-ins (before pyfuse3.main); None if streak is 0."""
    if streak <= 0:
        pyfuse3.trio = trio
        return None
    drain = Drain(streak)
    lowlevel = types.SimpleNamespace(**vars(trio.lowlevel))
    lowlevel.wait_readable = drain.wait_readable
    shim = types.SimpleNamespace(**vars(trio))
    shim.lowlevel = lowlevel
    shim.Lock = Turn
    pyfuse3.trio = shim
    return drain
