"""The bounded power-cut campaign CI runs: two seeds, several hundred crash points.

See campaign.py for the workload, the crash points and every check. `make
crash-campaign SEEDS=N` runs the long one.
"""
from __future__ import annotations

import campaign


def test_power_cut_campaign() -> None:
    results, seconds = campaign.campaign([1, 2], n_ops=150, jobs=1, random_points=30, recovery_crashes=2)
    summary = campaign.summarise(results, seconds)
    print(summary)
    points = sum(r.crash_points + r.recovery_crash_points for r in results)
    assert points >= 300, f"only {points} crash points\n{summary}"
    assert sum(r.recovery_crash_points for r in results) > 0, summary
    assert not [v for r in results for v in r.violations], summary
