"""Where a Swift operation's time goes: the object server's threads and packfs's daemon.

Swift's object server serves every request of a worker in one thread, its eventlet hub;
only the end of a PUT or DELETE (the metadata, the fsync, the link into place) goes to
its pool of threads. Each `write()` the hub makes through FUSE puts it to sleep until
the daemon answers, and waking it again costs a scheduler round (on a virtual machine
whose idle vCPUs halt, an exit to the host). Through XFS the same calls mostly return
without sleeping. So for each operation a phase served, this gives the hub's time split
three ways, which add up to the phase's wall time: on a CPU, runnable but waiting for
one, and off a CPU (asleep: on a FUSE request, a disk, or idle in epoll); how many
turns on a CPU it took (one after each sleep or preemption); the pool threads' CPU; and
packfs's daemon's CPU.

It reads the kernel's per-thread scheduler statistics (/proc/PID/task/TID/schedstat:
ns on a CPU, ns waiting on a run queue, times run) before and after a phase. A thread
that ends within a phase is missed; eventlet's pool threads live as long as their worker.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .util import median

FIELDS = (("wall_us", "wall time"), ("hub_cpu_us", "hub on a CPU"), ("hub_runq_us", "hub waiting for a CPU"),
          ("hub_off_us", "hub off a CPU"), ("hub_turns", "hub turns on a CPU"), ("pool_cpu_us", "pool threads' CPU"),
          ("daemon_cpu_us", "daemon CPU"))


def _threads(pid: int) -> dict[int, tuple[int, int, int]]:
    """{tid: (ns on a CPU, ns waiting for one, times run)} of a process's threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait, slices = map(int, f.read().split())
        except (OSError, ValueError):
            continue
        out[int(tid)] = (run, wait, slices)
    return out


@dataclass
class Snapshot:
    at: float
    workers: dict[int, dict[int, tuple[int, int, int]]] = field(default_factory=dict)
    daemon: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def snapshot(worker_pids: list[int], daemon_pid: int | None) -> Snapshot:
    """The object server's worker processes (not its parent, which only waits) and the daemon."""
    return Snapshot(time.monotonic(), {pid: _threads(pid) for pid in worker_pids},
                    _threads(daemon_pid) if daemon_pid else {})


def per_op(before: Snapshot, after: Snapshot, ops: int) -> dict[str, float] | None:
    """Each FIELDS figure per operation (µs, or turns), the hubs of several workers
    summed; None without operations or worker threads."""
    hubs = [pid for pid in after.workers if pid in after.workers[pid] and pid in before.workers]
    if not ops or not hubs:
        return None

    def delta(a: dict, b: dict, tid: int) -> tuple[int, int, int]:
        new, old = a.get(tid, (0, 0, 0)), b.get(tid, (0, 0, 0))
        return new[0] - old[0], new[1] - old[1], new[2] - old[2]
    wall_ns = (after.at - before.at) * 1e9
    hub = [delta(after.workers[p], before.workers[p], p) for p in hubs]
    pool_ns = sum(delta(after.workers[p], before.workers[p], t)[0]
                  for p in hubs for t in after.workers[p] if t != p)
    daemon_ns = sum(delta(after.daemon, before.daemon, t)[0] for t in after.daemon)
    cpu, runq, turns = (sum(h[i] for h in hub) for i in range(3))
    return {"wall_us": wall_ns / 1e3 / ops, "hub_cpu_us": cpu / 1e3 / ops, "hub_runq_us": runq / 1e3 / ops,
            "hub_off_us": max(0.0, len(hubs) * wall_ns - cpu - runq) / 1e3 / ops,
            "hub_turns": turns / ops, "pool_cpu_us": pool_ns / 1e3 / ops,
            "daemon_cpu_us": daemon_ns / 1e3 / ops if after.daemon else None}


def table(samples: dict[tuple[str, str], list[dict]]) -> dict:
    """A report table from {(case, filesystem): [per_op(...), ...]}: medians of each figure."""
    rows = []
    for (case, fs), got in samples.items():
        row: list = [case, fs]
        for key, _ in FIELDS:
            vals = [g[key] for g in got if g.get(key) is not None]
            row.append(round(median(vals), 1) if vals else "—")
        rows.append(row)
    return {"title": "Where a Swift operation's time goes (per operation, medians of the repetitions)",
            "note": "The object server's hub (the thread that serves every request; per worker, summed) "
                    "spends the wall time on a CPU, waiting for a CPU, or off a CPU (asleep: on a FUSE "
                    "request, a disk, or idle); the pool threads run the end of a PUT or DELETE (fsync, "
                    "link). At concurrency 16 the wall time per operation is the phase's time divided by "
                    "its operations. From /proc/PID/task/TID/schedstat around each phase (bench/timesplit.py).",
            "columns": ["operation", "filesystem", *(f"{label} (µs)" if key != "hub_turns" else label
                                                     for key, label in FIELDS)],
            "rows": rows}
