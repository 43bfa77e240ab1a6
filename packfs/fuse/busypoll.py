"""Busy polling: the task that reads the next FUSE request polls for it for a moment.

Between two FUSE requests of one Swift thread lie only tens of microseconds of its own
work. A loop that went to sleep in epoll_wait in between must be woken for the next
request, and that wake-up was most of the wall time of a request here (the daemon was
idle 83% of a GET run). So for `window_us` after each request, the task that waits for
the next one polls /dev/fuse in place (fuseloop.Drain.wait_readable), and only then
parks in trio's wait as before.

In place, not by turns of the trio loop: a task parked in trio's wait_readable, with
another task turning the loop until epoll saw the request, paid for the park, the
turns and its own wake-up on every request. It polls only while no other task is ready
to run, and never while a thread of the store (the log writer, a disk read) has work:
a polling loop holds the GIL between polls, and takes a core from the C log writer and
the application. The cost is CPU, at most `window_us` per request, and only while
requests keep coming.

Between two polls it yields its CPU (sched_yield) to any thread that is ready to run
there: a spinning loop otherwise keeps the CPU for its share of the scheduler's time,
and the threads queued behind it wait, Swift's among them, whose next request is what
the loop waits for. With a CPU-bound process on the loop's CPU, that process had half
of it while the loop spun, and all of it with the yield (tests/unit/test_busypoll.py).
Swift 4 KiB PUT at concurrency 16 (five alternated pairs, 4e15f84, 2026-11-27): 599-630 against
534-594 ops/s; in three of them the object server's threads waited for a CPU 829-867
against 1,169-1,268 us per PUT. 100 KiB and 1 MiB PUT and 4 KiB GET at concurrency 16,
PUT and GET at concurrency 1, and fio's small files and 64 KiB stream moved within the
noise.
"""
from __future__ import annotations

import os
import select
import time
from typing import Callable

import trio


class BusyPoll:
    def __init__(self, window_us: int, quiet: Callable[[], bool]) -> None:
        self.window_ns = window_us * 1000
        self.quiet = quiet  # False while polling would starve another thread
        self.last = 0  # perf_counter_ns of the last request served
        self.spins = 0  # polls made (`packfs stats`: busy_poll_turns)
        self.caught = 0  # windows in which a request came (busy_poll_caught)
        self.expired = 0  # windows that closed with none: the loop slept (busy_poll_expired)

    def touch(self) -> None:
        """A request was just served."""
        self.last = time.perf_counter_ns()

    def await_request(self, queue: select.poll) -> bool:
        """Poll `queue` until it is readable (True) or the window after the last request
        closes (False); False at once while the store's threads have work or another
        task is ready to run."""
        deadline = self.last + self.window_ns
        if (not self.window_ns or time.perf_counter_ns() >= deadline or not self.quiet()
                or trio.lowlevel.current_statistics().tasks_runnable):
            return False
        spins = 0
        try:
            while True:
                spins += 1
                if queue.poll(0):
                    self.caught += 1
                    return True
                if time.perf_counter_ns() >= deadline:
                    self.expired += 1
                    return False
                os.sched_yield()
        finally:
            self.spins += spins
