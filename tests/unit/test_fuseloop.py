"""fuseloop's stand-ins for pyfuse3's read lock and wait: exclusive, and no scheduler
pass while requests are queued, up to the streak."""
from __future__ import annotations

import os
from typing import Iterator

import pyfuse3
import pytest
import trio

from packfs.fuse.fuseloop import Drain, Turn, install


def _run(main, *instruments: trio.abc.Instrument):
    """trio.run(main), failing after 10 s: a lost wake-up fails the test instead of hanging it."""
    async def bounded():
        with trio.fail_after(10):
            return await main()

    return trio.run(bounded, instruments=list(instruments))


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        os.close(r)
        os.close(w)


def test_the_turn_is_held_by_one_task_at_a_time():
    turn = Turn()
    inside = []
    most = []

    async def reader(n: int) -> None:
        for _ in range(n):
            async with turn:
                inside.append(1)
                most.append(len(inside))
                await trio.sleep(0)  # a handler that blocks while holding the turn
                inside.pop()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(reader, 20)

    _run(main, turn)
    assert len(most) == 100
    assert max(most) == 1


def test_a_waiting_task_gets_the_turn_when_the_holder_blocks_after_release():
    turn = Turn()
    order = []

    async def holder(release: trio.Event) -> None:
        async with turn:
            order.append("holder in")
            await release.wait()
        order.append("holder out")
        await trio.sleep(0.01)  # blocked in its handler: the waiter must not stay parked

    async def waiter() -> None:
        async with turn:
            order.append("waiter in")

    async def main() -> None:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder, release)
            await trio.sleep(0.01)
            nursery.start_soon(waiter)
            await trio.sleep(0.01)
            assert order == ["holder in"]
            release.set()

    _run(main, turn)
    assert order == ["holder in", "holder out", "waiter in"]


class _Steps(trio.abc.Instrument):
    """Counts the steps each task takes, by name."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1


def _waiter_steps(holder_blocks: bool) -> int:
    """Steps the parked task takes while another releases the turn and serves a request."""
    turn = Turn()
    steps = _Steps()

    async def waiter() -> None:
        async with turn:
            pass

    async def main() -> int:
        async with trio.open_nursery() as nursery:
            async with turn:  # the turn is held: the waiter parks
                nursery.start_soon(waiter, name="waiter")
                await trio.sleep(0.01)
            before = steps.steps["waiter"]
            if holder_blocks:
                await trio.sleep(0.01)  # a handler that blocks: the turn must pass on
            else:
                async with turn:  # served without blocking: back for the next request
                    await trio.sleep(0.01)  # (waiting in epoll, holding the turn)
            woken = steps.steps["waiter"] - before
            nursery.cancel_scope.cancel()
        return woken

    return _run(main, turn, steps)


def test_a_release_wakes_no_waiter_when_the_turn_is_taken_back_in_the_same_step():
    assert _waiter_steps(holder_blocks=False) == 0


def test_a_release_wakes_a_waiter_when_the_releaser_blocks():
    assert _waiter_steps(holder_blocks=True) >= 1


def test_without_the_instrument_a_release_wakes_a_waiter_at_once():
    """A run that was not given the turn as an instrument would never pay a wake."""
    order = []

    async def main() -> None:
        turn = Turn()

        async def waiter() -> None:
            async with turn:
                order.append("waiter in")

        async with trio.open_nursery() as nursery:
            async with turn:
                nursery.start_soon(waiter)
                await trio.sleep(0.01)
            await trio.sleep(0.01)  # blocked: the waiter must have the turn by now
            order.append("holder blocked")

    _run(main)
    assert order == ["waiter in", "holder blocked"]


def test_a_free_turn_is_taken_without_a_checkpoint():
    """Inside a cancelled scope every trio checkpoint raises: trio.Lock's would."""
    turn = Turn()

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            for _ in range(10):
                async with turn:
                    pass
            with pytest.raises(trio.Cancelled):
                async with trio.Lock():
                    pass
        assert scope.cancelled_caught is False

    _run(main, turn)


def test_queued_input_skips_the_wait_up_to_the_streak(pipe):
    r, w = pipe
    os.write(w, b"x")
    drain = Drain(3)
    served = []

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            for _ in range(4):  # the fourth goes through trio's wait: a checkpoint
                await drain.wait_readable(r)
                served.append(True)
        assert scope.cancelled_caught

    _run(main)
    assert len(served) == 3
    assert drain.skipped == 3
    assert drain.run == 0


def test_no_input_waits_until_some_arrives(pipe):
    r, w = pipe
    drain = Drain(8)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            async def later() -> None:
                await trio.sleep(0.05)
                os.write(w, b"x")

            nursery.start_soon(later)
            started = trio.current_time()
            await drain.wait_readable(r)
            return trio.current_time() - started

    assert _run(main) >= 0.04
    assert drain.skipped == 0


def test_a_request_that_comes_while_the_task_busy_polls_skips_the_wait(pipe):
    r, w = pipe
    drain = Drain(8)
    polled = []

    def await_request(queue) -> bool:
        os.write(w, b"x")  # the request comes while the task polls
        polled.append(True)
        return bool(queue.poll(0))

    drain.await_request = await_request

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()  # any wait in trio would raise Cancelled
            await drain.wait_readable(r)

    _run(main)
    assert polled == [True]
    assert drain.skipped == 1 and drain.run == 1


def test_install_gives_pyfuse3_the_stand_ins_and_zero_gives_back_trio():
    try:
        assert install(0, busy_polling=True).streak == 0  # busy polling alone needs the stand-ins too
        drain = install(8, busy_polling=False)
        assert drain is not None and drain.streak == 8
        assert pyfuse3.trio.Lock() is drain.turn  # pyfuse3 makes one lock: the instrumented one
        assert pyfuse3.trio.lowlevel.wait_readable == drain.wait_readable
        # everything else pyfuse3 uses is trio's own
        assert pyfuse3.trio.ClosedResourceError is trio.ClosedResourceError
        assert pyfuse3.trio.open_nursery is trio.open_nursery
        assert pyfuse3.trio.lowlevel.current_trio_token is trio.lowlevel.current_trio_token
        assert trio.Lock is not Turn  # the real module is untouched
        assert install(0, busy_polling=False) is None
        assert pyfuse3.trio is trio
    finally:
        pyfuse3.trio = trio
