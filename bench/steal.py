"""Host CPU steal: how much of this VM's CPU time the host gave to other work, per case.

A guest's vCPU that is ready to run waits while the host runs something else, and the
guest counts that wait as steal (/proc/stat). packfs feels it more than XFS: each FUSE
round trip wakes two threads, and a wake-up that finds its vCPU descheduled waits for
the host. On the machine of session 49 steal took 4% to 29% of the CPU time within
minutes, and four cold walks of the same tree on one mount took 280, 424, 611 and
428 µs a directory with steal at 159, 443, 877 and 457 ticks. A ratio is only as good
as the conditions of its two sides, so every case of every part is measured for it
(`Part.guard`) and the report gives each filesystem's share and its worst case.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


def cpu_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of every CPU since boot; guest time is inside user."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return fields[7], sum(fields)  # user nice system idle iowait irq softirq steal


@dataclass
class Steal:
    """One filesystem's cases in one part: steal summed, and the worst case."""

    stolen: int = 0  # ticks
    ticks: int = 0  # every CPU's ticks in the same time
    cases: int = 0
    seconds: float = 0.0
    worst_pct: float = 0.0
    worst_case: str = ""

    def add(self, case: str, stolen: int, ticks: int, seconds: float) -> None:
        self.stolen += stolen
        self.ticks += ticks
        self.cases += 1
        self.seconds += seconds
        pct = 100.0 * stolen / ticks if ticks else 0.0
        if pct > self.worst_pct or not self.worst_case:
            self.worst_pct, self.worst_case = pct, case

    @property
    def pct(self) -> float:
        return 100.0 * self.stolen / self.ticks if self.ticks else 0.0


class Meter:
    """Measures the steal around each case, by filesystem."""

    def __init__(self) -> None:
        self.by_fs: dict[str, Steal] = {}

    def start(self) -> tuple[int, int, float]:
        return (*cpu_ticks(), time.monotonic())

    def stop(self, fs: str, case: str, started: tuple[int, int, float]) -> float:
        """Adds the case to its filesystem's sum; returns the case's steal in percent."""
        stolen0, ticks0, t0 = started
        stolen, ticks = cpu_ticks()
        stolen, ticks = stolen - stolen0, ticks - ticks0
        self.by_fs.setdefault(fs, Steal()).add(case, stolen, ticks, time.monotonic() - t0)
        return 100.0 * stolen / ticks if ticks else 0.0

    def to_dict(self) -> dict[str, dict]:
        return {fs: {"stolen": s.stolen, "ticks": s.ticks, "cases": s.cases, "seconds": round(s.seconds, 1),
                     "pct": round(s.pct, 2), "worst_pct": round(s.worst_pct, 2), "worst_case": s.worst_case}
                for fs, s in self.by_fs.items()}


def summary(per_part: dict[str, dict[str, dict]]) -> str:
    """One line for the report's head: each filesystem's steal over every part."""
    total: dict[str, list[int]] = {}
    for by_fs in per_part.values():
        for fs, s in by_fs.items():
            t = total.setdefault(fs, [0, 0])
            t[0] += s["stolen"]
            t[1] += s["ticks"]
    if not total:
        return ""
    shares = ", ".join(f"{fs} {100.0 * s / t:.1f}%" for fs, (s, t) in total.items() if t)
    return (f"Host CPU steal during each filesystem's cases (the share of this VM's CPU time the host "
            f"ran other work; bench/steal.py): {shares}. A ratio between two filesystems whose steal "
            "differs by several points says as much about the host as about them.")


def table(per_part: dict[str, dict[str, dict]]) -> dict | None:
    """The report's table: steal by part and filesystem, with the worst case."""
    rows = [[part, fs, str(s["cases"]), f"{s['seconds']:.0f}", f"{s['pct']:.1f}", f"{s['worst_pct']:.1f}",
             s["worst_case"]]
            for part, by_fs in per_part.items() for fs, s in by_fs.items()]
    if not rows:
        return None
    return {"title": "Host CPU steal during each filesystem's cases",
            "note": "Share of every CPU's time that /proc/stat counts as stolen while the cases ran "
                    "(all of the machine's CPUs, so the other side's processes count too).",
            "columns": ["part", "filesystem", "cases", "seconds", "steal (%)", "worst case (%)", "worst case"],
            "rows": rows}
