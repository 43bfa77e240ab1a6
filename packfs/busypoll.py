"""Busy polling: keep the event loop polling /dev/fuse for a moment after each request.

Between two FUSE requests of one Swift thread lie only tens of microseconds of its own
work. A loop that went to sleep in epoll_wait in between must be woken for the next
request, and that wake-up was most of the wall time of a request here (the daemon was
idle 83% of a GET run). So after each request the loop stays awake, yielding at every
turn, for `window_us`; then it sleeps as before. It never polls while a thread of the
store (the log writer, a disk read) has work: a polling loop holds the GIL, which a
Python thread would wait for until the interpreter's switch interval (5 ms) forces a
turn, and takes a core from the C log writer and the application.
The cost is CPU, at most `window_us` per request, and only while requests keep coming.
"""
from __future__ import annotations

import time
from typing import Callable

import trio


class BusyPoll:
    def __init__(self, window_us: int, quiet: Callable[[], bool]) -> None:
        self.window_ns = window_us * 1000
        self.quiet = quiet  # False while polling would starve another thread
        self.last = 0  # perf_counter_ns of the last request served
        self.spins = 0  # loop turns spent polling (`packfs stats`: busy_poll_turns)
        self._polling = False
        self._wake = trio.Event()

    def touch(self) -> None:
        """A request was just served."""
        self.last = time.perf_counter_ns()
        if not self._polling and self.window_ns and self.quiet():
            self._wake.set()  # (not while the store is busy: no wake-up that would only stop)

    async def run(self) -> None:
        if not self.window_ns:
            return
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._polling = True
            try:
                while time.perf_counter_ns() - self.last < self.window_ns and self.quiet():
                    self.spins += 1
                    await trio.lowlevel.checkpoint()  # one turn of the loop: epoll_wait(0)
            finally:
                self._polling = False
