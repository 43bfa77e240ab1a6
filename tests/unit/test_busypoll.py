"""BusyPoll keeps the loop turning for its window after a request, and only then."""
from __future__ import annotations

import trio

from packfs.busypoll import BusyPoll


def _turns_after_one_request(window_us: int, quiet: bool) -> tuple[int, int]:
    """(turns within 200 ms of a request, turns in the 200 ms after that)."""
    bp = BusyPoll(window_us, lambda: quiet)

    async def main() -> tuple[int, int]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bp.run)
            await trio.sleep(0.01)
            bp.touch()
            await trio.sleep(0.2)
            first = bp.spins
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        return first, bp.spins - first

    return trio.run(main)


def test_the_loop_polls_for_the_window_and_then_sleeps():
    during, after = _turns_after_one_request(20_000, quiet=True)
    assert during > 10
    assert after == 0


def test_no_polling_while_another_thread_needs_the_gil():
    assert _turns_after_one_request(20_000, quiet=False) == (0, 0)


def test_a_zero_window_never_polls():
    assert _turns_after_one_request(0, quiet=True) == (0, 0)
