"""The guest's halt polling (cpuidle-haltpoll), which every FUSE round trip pays for.

A request blocks its thread until the daemon answers, and that thread's CPU goes idle.
In a KVM guest an idle CPU halts, and waking it for the reply costs an exit to the host
and back: measured here, a getxattr answered in C took 16.2 us a round trip without
halt polling and 7.5 us with it. The guest's cpuidle-haltpoll driver polls for up to
`guest_halt_poll_ns` before it halts; the kernel's default is 200 us, and this
platform's kernel command line sets 0. XFS pays such wake-ups too, where it waits for
the disk, but far fewer per Swift GET or directory walk: the setting moves packfs's
ratios there, and hardly where both wait for flushes (docs/bench-latest.md).

Every report says what the run had. `BENCH_HALT_POLL_NS=N` sets it for the run and puts
the machine's value back at the end; by default the machine's setting is measured as
it is.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from .util import log

PARAMETER = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def current() -> int | None:
    """The machine's guest_halt_poll_ns, None where there is no cpuidle-haltpoll."""
    try:
        return int(PARAMETER.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def window(wanted: str) -> Iterator[int | None]:
    """Run with guest_halt_poll_ns set to `wanted` ("": as the machine has it);
    yields the value in force, and puts the machine's back afterwards."""
    before = current()
    if not wanted:
        yield before
        return
    if before is None:
        raise SystemExit(f"BENCH_HALT_POLL_NS={wanted}: this machine has no {PARAMETER}")
    if not wanted.isdigit():
        raise SystemExit(f"BENCH_HALT_POLL_NS={wanted}: must be 0 or more nanoseconds")
    ns = int(wanted)
    PARAMETER.write_text(f"{ns}\n")
    log(f"guest_halt_poll_ns {before} -> {ns} for this run")
    try:
        yield ns
    finally:
        PARAMETER.write_text(f"{before}\n")
        log(f"guest_halt_poll_ns back to {before}")


def describe(ns: int | None, asked: bool) -> str:
    """A report's line on it."""
    if ns is None:
        return "Guest halt polling: none (no cpuidle-haltpoll on this machine)."
    how = "set by BENCH_HALT_POLL_NS for this run" if asked else "the machine's setting"
    return f"Guest halt polling: guest_halt_poll_ns={ns} ({how}; see bench/haltpoll.py)."
