"""Host CPU steal: how much of this VM's CPU time the host gave to other work, per case.

A guest's vCPU that is ready to run waits while the host runs something else, and the
guest counts that wait as steal (/proc/stat). packfs feels it more than XFS: each FUSE
round trip wakes two threads, and a wake-up that finds its vCPU descheduled waits for
the host. On this project's VM on 2026-11-28 (at ddb4705) steal took 0% to 35% of the CPU time within
minutes, and four cold walks of the same tree on one mount took 280, 424, 611 and
428 µs a directory with steal at 159, 443, 877 and 457 ticks. A ratio is only as good
as the conditions of its two sides, so every case of every part is measured for it
(`Part._guard`) and the report gives each filesystem's share and its worst case.

Two shares: of all the CPU time, and of the busy time (not idle, not waiting for I/O).
A vCPU that is idle is not waiting for the host, so a workload that keeps the CPUs
busier is stolen from more (in the first `QUICK=1 make bench` with this, 2026-11-28 at
39b2f64, packfs's cases 19.6% of the CPU time against XFS's 12.1%). The share of busy
time says whether the host treated the two alike for what each asked of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple


class Ticks(NamedTuple):
    """Clock ticks of every CPU since boot (guest time is inside user)."""

    stolen: int
    busy: int  # neither idle nor waiting for I/O (steal included)
    all: int


def cpu_ticks() -> Ticks:
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return Ticks(steal, total - idle - iowait, total)


@dataclass
class Steal:
    """One filesystem's cases in one part: steal summed, and the worst case."""

    stolen: int = 0  # ticks
    busy: int = 0  # ticks neither idle nor waiting for I/O
    ticks: int = 0  # every CPU's ticks in the same time
    cases: int = 0
    seconds: float = 0.0
    worst_pct: float = 0.0
    worst_case: str = ""

    def add(self, case: str, used: Ticks, seconds: float) -> None:
        self.stolen += used.stolen
        self.busy += used.busy
        self.ticks += used.all
        self.cases += 1
        self.seconds += seconds
        pct = _pct(used.stolen, used.all)
        if pct > self.worst_pct or not self.worst_case:
            self.worst_pct, self.worst_case = pct, case

    @property
    def pct(self) -> float:
        return _pct(self.stolen, self.ticks)

    @property
    def busy_pct(self) -> float:
        return _pct(self.stolen, self.busy)


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


class Meter:
    """Measures the steal around each case, by filesystem."""

    def __init__(self) -> None:
        self.by_fs: dict[str, Steal] = {}

    def start(self) -> tuple[Ticks, float]:
        return cpu_ticks(), time.monotonic()

    def stop(self, fs: str, case: str, started: tuple[Ticks, float]) -> float:
        """Adds the case to its filesystem's sum; returns the case's steal in percent."""
        before, t0 = started
        now = cpu_ticks()
        used = Ticks(*(a - b for a, b in zip(now, before)))
        self.by_fs.setdefault(fs, Steal()).add(case, used, time.monotonic() - t0)
        return _pct(used.stolen, used.all)

    def to_dict(self) -> dict[str, dict]:
        return {fs: {"stolen": s.stolen, "busy": s.busy, "ticks": s.ticks, "cases": s.cases,
                     "seconds": round(s.seconds, 1), "pct": round(s.pct, 2), "busy_pct": round(s.busy_pct, 2),
                     "worst_pct": round(s.worst_pct, 2), "worst_case": s.worst_case}
                for fs, s in self.by_fs.items()}


def summary(per_part: dict[str, dict[str, dict]], order: tuple[str, ...]) -> str:
    """One line for the report's head: each filesystem's steal over every part, in `order`."""
    total: dict[str, Steal] = {}
    for by_fs in per_part.values():
        for fs, s in by_fs.items():
            t = total.setdefault(fs, Steal())
            t.stolen += s["stolen"]
            t.busy += s.get("busy", 0)
            t.ticks += s["ticks"]
    if not total:
        return ""
    shares = ", ".join(f"{fs} {t.pct:.1f}%" + (f" ({t.busy_pct:.1f}% of its busy time)" if t.busy else "")
                       for fs, t in sorted(total.items(), key=lambda i: order.index(i[0]) if i[0] in order else 9))
    return (f"Host CPU steal during each filesystem's cases (the share of this VM's CPU time the host "
            f"ran other work; bench/steal.py): {shares}. Where the shares of busy time differ by "
            "several points the host treated the two sides of a ratio differently.")


def table(per_part: dict[str, dict[str, dict]]) -> dict | None:
    """The report's table: steal by part and filesystem, with the worst case."""
    rows = [[part, fs, str(s["cases"]), f"{s['seconds']:.0f}", f"{s['pct']:.1f}",
             f"{s['busy_pct']:.1f}" if "busy_pct" in s else "—",
             f"{s['worst_pct']:.1f}", s["worst_case"]]
            for part, by_fs in per_part.items() for fs, s in by_fs.items()]
    if not rows:
        return None
    return {"title": "Host CPU steal during each filesystem's cases",
            "note": "Share of every CPU's time, and of its busy time (neither idle nor waiting for I/O), that "
                    "/proc/stat counts as stolen while the cases ran (all of the machine's CPUs, so the other "
                    "side's processes count too).",
            "columns": ["part", "filesystem", "cases", "seconds", "steal (%)", "steal of busy time (%)",
                        "worst case (%)", "worst case"],
            "rows": rows}
