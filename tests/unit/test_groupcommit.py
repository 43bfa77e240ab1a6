"""What each device flush shared (packfs/store/groupcommit.py), counted per flush."""
from __future__ import annotations

from packfs.store.groupcommit import GroupCommits, SmallCounts


def test_a_flush_counts_what_arrived_since_the_one_before():
    g = GroupCommits()
    g.written([(5, False), (0, True)], writes=1, flushes=1)  # a lone fsync of file 5
    g.written([(6, False), (7, False)], writes=1, flushes=0)  # written, not flushed yet
    g.written([(6, False), (0, True), (8, False), (0, True)], writes=2, flushes=1)  # two commits, one flush
    r = g.report()
    assert r["flushes"] == 2
    assert r["commits_per_flush"] == {"mean": 1.5, "p99": 2}
    assert r["files_per_flush"] == {"mean": 2.0, "p99": 3}  # file 6 twice in one flush is one file
    assert r["writes_per_flush"] == {"mean": 2.0, "p99": 3}


def test_the_p99_is_the_value_below_which_99_percent_fall():
    c = SmallCounts()
    for _ in range(99):
        c.add(1)
    c.add(40)
    assert c.report() == {"mean": 1.39, "p99": 1}
    c.add(40)
    assert c.quantile(0.99) == 40
    assert SmallCounts().report() == {"mean": 0, "p99": 0}
