"""bench/steal.py and bench/part.py: every case of a part is measured for host CPU steal,
failed or not, and the report says each filesystem's share."""
import time
from types import SimpleNamespace

from bench import report, steal
from bench.part import Part
from bench.results import Results


def test_cpu_ticks_reads_the_machine():
    t = steal.cpu_ticks()
    assert 0 <= t.stolen <= t.busy <= t.all and t.all > 0
    meter = steal.Meter()
    started = meter.start()
    time.sleep(0.05)
    pct = meter.stop("packfs", "round 1", started)  # (optionsab prints it per round)
    assert 0.0 <= pct <= 100.0 and meter.by_fs["packfs"].cases == 1 and meter.by_fs["packfs"].ticks > 0


def test_steal_sums_cases_and_keeps_the_worst():
    s = steal.Steal()
    s.add("4K c1", steal.Ticks(stolen=10, busy=100, all=200), seconds=1.0)
    s.add("4K c16", steal.Ticks(stolen=90, busy=300, all=300), seconds=1.5)
    s.add("1M c16", steal.Ticks(stolen=0, busy=100, all=500), seconds=2.5)
    assert s.cases == 3 and s.seconds == 5.0
    assert s.pct == 10.0  # 100 of 1,000 ticks
    assert s.busy_pct == 20.0  # 100 of 500 busy ticks
    assert (s.worst_pct, s.worst_case) == (30.0, "4K c16")


class _Bench(Part):
    def __init__(self) -> None:
        self.res = Results("swift")
        self.targets = [SimpleNamespace(name=n) for n in ("packfs", "xfs", "ext4")]


def test_every_case_is_measured_and_a_failure_is_noted():
    b = _Bench()
    assert [t.name for t in b._order(1)] == ["xfs", "ext4", "packfs"]
    assert b._guard("4K c1", b.targets[0], lambda: time.sleep(0.05) or 42) == 42  # a few ticks long

    def fails() -> None:
        raise RuntimeError("object server gone")

    assert b._guard("4K c16", b.targets[0], fails) is None
    assert b._guard("4K c1", b.targets[1], lambda: None) is None
    got = b.res.to_dict()["steal"]
    assert got["packfs"]["cases"] == 2 and got["xfs"]["cases"] == 1 and "ext4" not in got
    assert got["packfs"]["ticks"] > 0 and got["packfs"]["seconds"] >= 0.05
    assert b.res.notes == ["packfs: swift 4K c16 failed: object server gone"]


def test_the_report_gives_each_filesystem_its_share_over_every_part():
    def part(name: str, by_fs: dict) -> dict:
        return {"part": name, "meta": {}, "medians": {}, "samples": {}, "config": {name: {"quick": True, "reps": 2}},
                "steal": by_fs}

    def fs(stolen: int, ticks: int, worst: float, case: str) -> dict:
        busy = ticks // 2
        return {"stolen": stolen, "busy": busy, "ticks": ticks, "cases": 4, "seconds": 10.0,
                "pct": 100.0 * stolen / ticks, "busy_pct": 100.0 * stolen / busy, "worst_pct": worst,
                "worst_case": case}

    d = report.merge([part("fio", {"packfs": fs(50, 1000, 9.0, "small"), "xfs": fs(10, 1000, 2.0, "stream")}),
                      part("swift", {"packfs": fs(250, 1000, 40.0, "4K c16"), "xfs": fs(30, 1000, 5.0, "1M c1")})])
    md = report.markdown(d)
    # (50 + 250) / 2,000 and (10 + 30) / 2,000; of busy time, of half as many ticks
    assert "packfs 15.0% (30.0% of its busy time), xfs 2.0% (4.0% of its busy time)" in md
    assert "| swift | packfs | 4 | 10 | 25.0 | 50.0 | 40.0 | 4K c16 |" in md
