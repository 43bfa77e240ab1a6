"""bench/timesplit.py reads real processes' scheduler statistics: a thread that sleeps is
off a CPU, one that spins is on one, and a process's other threads count as its pool."""
import subprocess
import sys
import time

import pytest

from bench import timesplit

SLEEPER = "import time\nfor _ in range(100): time.sleep(0.002)\n"
SPINNER = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.3: pass\n"
POOL = ("import threading, time\n"
        "def spin():\n    t = time.monotonic()\n    while time.monotonic() - t < 0.3: pass\n    time.sleep(60)\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "time.sleep(0.5)\n")  # the thread lives on (as eventlet's pool threads do)


def split(code: str, ops: int) -> dict:
    """timesplit.per_op of a child process running `code`: snapshots just before it starts
    (it waits for a line on stdin) and once it says it is done (its threads still live)."""
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\n" + code +
                           "print('done', flush=True); sys.stdin.readline()\n"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        time.sleep(0.2)
        before = timesplit.snapshot([p.pid], None)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "done\n"
        after = timesplit.snapshot([p.pid], None)
        p.stdin.close()  # the child's last readline returns: it exits
    got = timesplit.per_op(before, after, ops)
    assert got is not None
    return got


def test_a_sleeping_hub_is_off_a_cpu_and_turns_once_per_sleep():
    got = split(SLEEPER, ops=100)
    assert got["hub_turns"] >= 1  # at least one turn on a CPU per sleep
    assert got["hub_off_us"] > 0.5 * got["wall_us"]
    assert got["hub_cpu_us"] + got["hub_runq_us"] + got["hub_off_us"] == pytest.approx(got["wall_us"], rel=0.01)
    assert got["daemon_cpu_us"] is None  # no daemon given


def test_a_spinning_hub_is_on_a_cpu():
    got = split(SPINNER, ops=1)
    assert got["hub_cpu_us"] >= 250_000  # 0.3 s of spinning
    assert got["pool_cpu_us"] < 50_000


def test_other_threads_are_the_pool():
    got = split(POOL, ops=1)
    assert got["pool_cpu_us"] >= 250_000
    assert got["hub_cpu_us"] < 250_000


def test_no_operations_no_split():
    snap = timesplit.snapshot([], None)
    assert timesplit.per_op(snap, snap, 10) is None


def test_table_gives_medians_per_operation_and_filesystem():
    one = {"wall_us": 10.0, "hub_cpu_us": 4.0, "hub_runq_us": 1.0, "hub_off_us": 5.0, "hub_turns": 3.0,
           "pool_cpu_us": 2.0, "daemon_cpu_us": None}
    other = {**one, "hub_cpu_us": 6.0}
    third = {**one, "hub_cpu_us": 20.0}
    t = timesplit.table({("Swift PUT 4 KiB c16", "xfs"): [one, other, third]})
    (row,) = t["rows"]
    assert row[:2] == ["Swift PUT 4 KiB c16", "xfs"]
    cols = dict(zip(t["columns"], row))
    assert cols["hub on a CPU (µs)"] == 6.0
    assert cols["daemon CPU (µs)"] == "—"
    assert len(row) == len(t["columns"])
