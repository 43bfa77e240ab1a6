"""How pyfuse3's request tasks take turns at /dev/fuse: drain the queue before yielding.

pyfuse3 runs a few request tasks. Each takes a trio Lock, waits in epoll for /dev/fuse
to be readable, lets go of the lock, reads one request and serves it. Per request that
is a lock hand-off to the next task (a task switch, plus the checkpoint trio's Lock
takes even when it is free) and an epoll re-arm and wait, whether or not more requests
are already waiting in the kernel. Against trio's own lock and wait (`drain=0`),
alternated on one pack, the stand-ins below took a third off the daemon's CPU per Swift
4 KiB PUT at concurrency 16 (docs/options.md, `drain`).

pyfuse3 reaches trio only through its module attribute `trio` (its asyncio mode swaps
it the same way), and its loop needs only `Lock` and `lowlevel.wait_readable` for this.
`install` gives it stand-ins for those two:

- `Turn`, the read lock, takes no checkpoint when free and hands nothing off: a task
  that served a request without blocking takes its turn again at once. A waiting task
  is woken only if the task that released the turn did not take it back within the
  same step (its handler blocked, or it left the loop): Turn is also a trio Instrument,
  and `after_task_step` pays that wake. Waking a waiter at every release made it run
  only to park again (measured: about a tenth of the loop's CPU in a Swift PUT at
  concurrency 1, where every request went that way).
- `wait_readable` asks poll(0) first, then busy-polls for a moment (busypoll.py): if a
  request is queued or comes, it returns without going through epoll or the scheduler.
  After `streak` such requests in a row it first lets every other trio task (the
  store's, the control socket's) run, one turn of the loop. When no request comes it
  waits the normal way, after telling `on_idle` (the journal's deferred work).

With `streak` 0 and no busy polling nothing is installed and pyfuse3 uses trio itself.
"""
from __future__ import annotations

import select
import types
from typing import Callable

import pyfuse3
import trio


class Turn(trio.abc.Instrument):
    """pyfuse3's read lock: free to take again without a task switch or a wake-up.

    Given to trio.run as an instrument, it wakes a waiter after the step of the task
    that released the turn, only if the turn is still free then; in a run without it, at
    every release.
    """

    def __init__(self) -> None:
        self._held = False
        self._releaser: trio.lowlevel.Task | None = None  # owes a wake unless it takes the turn back
        self._waiting = trio.lowlevel.ParkingLot()
        self._instrumented = False  # outside a run that has it as an instrument, wake at release

    async def __aenter__(self) -> None:
        while self._held:
            await self._waiting.park()
        self._held = True
        self._releaser = None

    async def __aexit__(self, *exc: object) -> None:
        self._held = False
        if self._waiting:
            if self._instrumented:
                self._releaser = trio.lowlevel.current_task()
            else:
                self._waiting.unpark()

    def before_run(self) -> None:
        self._instrumented = True

    def after_run(self) -> None:
        self._instrumented = False

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self._releaser:
            self._releaser = None
            if not self._held and self._waiting:
                self._waiting.unpark()


class Drain:
    """`wait_readable` for pyfuse3: no epoll round while requests are queued."""

    def __init__(self, streak: int) -> None:
        self.streak = streak
        self.turn = Turn()  # the one read lock pyfuse3 makes (an instrument of the trio run)
        self.run = 0  # requests read in a row without yielding
        self.skipped = 0  # waits answered by poll(0) (`packfs stats`: fuse_waits_skipped)
        self._polls: dict[int, select.poll] = {}
        # Called each time a task comes for the next request, so also after one the fuse
        # shim answered in C, which no handler sees (the busy poll's window starts there).
        self.on_read: Callable[[], None] = lambda: None
        # Polls for a request that has not come yet: True if one came (BusyPoll.await_request).
        self.await_request: Callable[[select.poll], bool] = lambda queue: False
        # Called when no request came and the loop is about to sleep in epoll.
        self.on_idle: Callable[[], None] = lambda: None

    async def wait_readable(self, fd: int) -> None:
        self.on_read()
        poll = self._polls.get(fd)
        if poll is None:
            poll = self._polls[fd] = select.poll()
            poll.register(fd, select.POLLIN)
        if self.run >= self.streak:
            self.run = 0
            await trio.lowlevel.checkpoint()  # every other task's turn
        if poll.poll(0) or self.await_request(poll):
            self.run += 1
            self.skipped += 1
            return
        self.run = 0
        self.on_idle()
        await trio.lowlevel.wait_readable(fd)


def install(streak: int, busy_polling: bool) -> Drain | None:
    """Give pyfuse3 the stand-ins (before trio.run, which must get `drain.turn` as an
    instrument); None if streak is 0 and there is no busy polling."""
    if streak <= 0 and not busy_polling:
        pyfuse3.trio = trio
        return None
    drain = Drain(streak)
    lowlevel = types.SimpleNamespace(**vars(trio.lowlevel))
    lowlevel.wait_readable = drain.wait_readable
    shim = types.SimpleNamespace(**vars(trio))
    shim.lowlevel = lowlevel
    shim.Lock = lambda: drain.turn
    pyfuse3.trio = shim
    return drain
