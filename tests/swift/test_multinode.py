"""Three Swift storage nodes, each in a network namespace of its own with 2 packfs devices:
a node fails under PUTs and returns (rsync), and a device is replaced by an empty one (ssync).

A smaller `make demo NODES=3` (mount/multinode_demo.py), on the same code: mount/multinode.py
runs the cluster, mount/failover.py takes it through the failure and the repair and raises
when a promise breaks; the asserts below say which promises.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from swiftenv import require_packfs, running  # puts mount/ on sys.path
from failover import check_listings, failure_round, replaced_device_round  # noqa: E402
from multinode import MultiNodeCluster  # noqa: E402
from netns import unavailable  # noqa: E402
from workload import Stored, verify_objects, workload  # noqa: E402

THREADS = 4


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> Iterator[MultiNodeCluster]:
    require_packfs()
    if why := unavailable():
        pytest.skip(why)
    c = MultiNodeCluster(tmp_path_factory.mktemp("multinode"), nodes=3, devices_per_node=2)
    with running(c):
        yield c


@pytest.fixture(scope="module")
def stored(nodes) -> Stored:
    """Small objects, a 2 MiB chunked and a 2 MiB content-length object, a 2-segment SLO;
    the failure round adds what it PUTs."""
    return workload(nodes.client, n_small=12, large_mib=2, slo_segments=2, seg_mib=1, threads=THREADS,
                    phases=[], ec=False)


def test_node_fails_under_puts_and_returns(nodes, stored):
    """node3's servers and packfs daemons are killed -9 while PUTs go on through the proxy:
    every acknowledged object reads back while it is down, the proxy wrote handoffs; after
    node3 mounts again (recovery) and one rsync pass of the replicators, every object is on
    each of its 3 primary devices byte for byte and on no handoff."""
    before = len(stored.objects)
    r = failure_round(nodes, "node3", "rsync", stored, before=6, after=24, threads=THREADS, phases=[])
    assert len(r.puts.during) >= 24
    assert r.read_while_down == before + len(r.puts.acked) == len(stored.objects)
    assert r.handoff_copies >= len(r.puts.during) // 2, "the proxy wrote few handoffs with node3 down"
    assert set(r.recovery) == {"sdb1", "sdb2"}
    assert r.replication.handoffs_removed > 0
    assert not r.placement.problems and not r.placement.handoffs
    assert r.placement.copies == 3 * len(stored.objects)


def test_replaced_device_refilled(nodes, stored):
    """node1's sdb1 is lost (pack directory removed, mounted again empty): one ssync pass of
    the replicators puts back every object it is a primary for, byte for byte, and exactly
    the account and container databases the rings make it a primary for (the rings are
    rebalanced at random each run: in about one run in 16 that is none of the 4, all of
    node1's replicas being on sdb2); every object reads back and every listing is whole."""
    r = replaced_device_round(nodes, "node1", "sdb1", "ssync", stored, phases=[])
    assert r.found == 0 and r.expected > 0
    assert r.restored == r.expected
    assert r.databases == len(r.expected_databases)
    assert r.expected_databases == nodes.database_files("node1", "sdb1")
    assert not r.placement.problems and not r.placement.handoffs
    assert r.placement.copies == 3 * len(stored.objects)
    verify_objects(nodes.client, stored.objects, THREADS)
    check_listings(nodes, stored)
