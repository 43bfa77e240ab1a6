"""BusyPoll polls for the next request for its window after a request, and only then."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from typing import Iterator

import pytest
import trio

from packfs.fuse.busypoll import BusyPoll


@pytest.fixture
def queue() -> Iterator[tuple[select.poll, int]]:
    """A poll object on a pipe's read end, and its write end."""
    r, w = os.pipe()
    p = select.poll()
    p.register(r, select.POLLIN)
    try:
        yield p, w
    finally:
        os.close(r)
        os.close(w)


def _await(bp: BusyPoll, p: select.poll, touch: bool = True) -> tuple[bool, float]:
    """(what await_request said, seconds it took), called in a trio run right after a request."""
    async def main() -> tuple[bool, float]:
        if touch:
            bp.touch()
        t0 = time.perf_counter()
        came = bp.await_request(p)
        return came, time.perf_counter() - t0

    return trio.run(main)


def test_a_request_that_comes_in_the_window_is_seen_at_once(queue):
    p, w = queue
    bp = BusyPoll(10_000_000, lambda: True)  # 10 s: the write comes long before
    threading.Timer(0.02, os.write, (w, b"x")).start()
    came, took = _await(bp, p)
    assert came and 0.015 < took < 5
    assert bp.spins > 1


def test_without_a_request_it_polls_for_the_window_then_gives_up(queue):
    p, _ = queue
    bp = BusyPoll(30_000, lambda: True)
    came, took = _await(bp, p)
    assert not came and 0.025 < took < 5
    assert bp.spins > 1


def test_no_polling_while_another_thread_needs_the_gil(queue):
    p, _ = queue
    bp = BusyPoll(30_000, lambda: False)
    assert _await(bp, p)[0] is False
    assert bp.spins == 0


def test_a_zero_window_never_polls(queue):
    p, _ = queue
    bp = BusyPoll(0, lambda: True)
    assert _await(bp, p)[0] is False
    assert bp.spins == 0


def test_no_polling_once_the_window_after_the_last_request_closed(queue):
    p, _ = queue
    bp = BusyPoll(30_000, lambda: True)
    bp.touch()
    time.sleep(0.05)
    assert _await(bp, p, touch=False)[0] is False
    assert bp.spins == 0


def test_no_polling_while_another_task_is_ready_to_run(queue):
    p, _ = queue
    bp = BusyPoll(30_000, lambda: True)

    async def main() -> bool:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)  # ready to run, not yet run
            bp.touch()
            return bp.await_request(p)

    assert trio.run(main) is False
    assert bp.spins == 0


def test_the_poll_gives_its_cpu_to_a_thread_ready_to_run_there(queue):
    """A CPU-bound process on the polling thread's CPU gets all of it while the poll
    spins (half of it if the poll did not yield: the scheduler shares the CPU fairly)."""
    p, _ = queue
    cpu = min(os.sched_getaffinity(0))
    spin = ("import os, sys, time\n"
            f"os.sched_setaffinity(0, {{{cpu}}})\n"
            "print('ready', flush=True)\n"
            "t = time.monotonic()\n"
            "while time.monotonic() - t < 30: pass\n")
    mask = os.sched_getaffinity(0)
    with subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout.readline() == "ready\n"
            os.sched_setaffinity(0, {cpu})

            def ran() -> int:
                with open(f"/proc/{child.pid}/schedstat") as f:
                    return int(f.read().split()[0])
            bp = BusyPoll(400_000, lambda: True)
            before, t0 = ran(), time.perf_counter()
            came, _ = _await(bp, p)
            share = (ran() - before) / 1e9 / (time.perf_counter() - t0)
        finally:
            os.sched_setaffinity(0, mask)
            child.kill()
    assert not came
    assert share > 0.8
