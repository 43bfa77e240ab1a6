"""make demo NODES=3: stock Swift on several storage nodes, through a node's failure and a lost disk.

Run by mount/demo.py (``--nodes N``), which sets the cluster up and tears it down.
On a :class:`MultiNodeCluster` (N nodes, each alone in a network namespace with 2
packfs devices, rsyncd and account, container and object servers; a proxy with
tempauth and memcached on 127.0.0.1; rings of 3 replicas, one zone per node):

1. the workload of mount/workload.py through the proxy: small objects, a chunked
   and a content-length large object, an SLO, every byte verified;
2. the last node fails while PUTs go on (its servers and packfs daemons killed
   -9); every acknowledged object reads back while it is down; it returns and one
   pass of the replicators with rsync moves the handoffs back; every copy is then
   read from the devices' own files (mount/failover.py);
3. the same with node2 and ssync;
4. node1's sdb1 is lost and replaced by an empty disk; one rsync pass refills it;
5. every acknowledged object read back through the proxy, the listings whole.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failover import FailureRound, ReplacedDevice, check_listings, failure_round, replaced_device_round  # noqa: E402
from multinode import MAX_NODES, MultiNodeCluster  # noqa: E402
from netns import unavailable  # noqa: E402
from workload import Phase, Stored, verify_objects, workload  # noqa: E402

LEAD = 20  # PUTs acknowledged before a node fails, so that it fails mid-stream


def check_args(args: argparse.Namespace) -> None:
    if not 3 <= args.nodes <= MAX_NODES:
        raise SystemExit(f"demo.py: --nodes {args.nodes}: 1, or 3 to {MAX_NODES} "
                         "(3 replicas, each node a zone of its own)")
    if why := unavailable():
        raise SystemExit(f"demo.py: --nodes {args.nodes}: {why}")


def run_parts(c: MultiNodeCluster) -> tuple[str, ...]:
    """What a multi-node run makes in its run directory."""
    return (*(f"node{i}" for i in range(1, c.n_nodes + 1)), "proxy", "multinode.json")


def run(c: MultiNodeCluster, args: argparse.Namespace, phases: list) -> Callable[[], None]:
    """Steps 1-5 of the module docstring; returns what prints the summary."""
    for name, node in c.nodes.items():
        print(f"   {name}: {node.ip} in network namespace {node.netns}; devices "
              + ", ".join(str(d.mountpoint) for d in node.devices))
    print(f"   proxy {c.proxy.proxy_url}; logs in {c.run_dir}/<node>/log")
    stored = workload(c.client, args.small, args.large_mib, args.slo_segments, 1, args.threads, phases, ec=False)
    before = len(stored.objects), stored.bytes
    names = list(c.nodes)
    rounds = [failure_round(c, names[-1], "rsync", stored, LEAD, args.failure_puts, args.threads, phases),
              failure_round(c, names[1], "ssync", stored, LEAD, args.failure_puts, args.threads, phases)]
    replaced = replaced_device_round(c, names[0], "sdb1", "rsync", stored, phases)
    with Phase(phases, f"GET every acknowledged object ({len(stored.objects)}), list every container"):
        verified = verify_objects(c.client, stored.objects, args.threads)
        check_listings(c, stored)
    return lambda: summary(c, stored, before, rounds, replaced, verified)


def summary(c: MultiNodeCluster, stored: Stored, before: tuple[int, int], rounds: list[FailureRound],
            replaced: ReplacedDevice, verified: int) -> None:
    net = c.network
    print(f"{c.n_nodes} storage nodes, each alone in a network namespace on bridge {net.bridge} "
          f"({net.subnet}), {c.devices_per_node} packfs devices each: "
          + ", ".join(f"{name} {node.ip}" for name, node in c.nodes.items()))
    print(f"proxy {c.proxy.proxy_url} (tempauth, memcached) in the root namespace; rings of 3 replicas, "
          f"one zone per node")
    print(f"stored before the failures: {before[0]} objects (SLO segments included), {before[1] / 2**20:.1f} MiB "
          f"x 3 replicas, verified byte for byte; {stored.deleted} deleted")
    for r in rounds:
        print(f"{r.node} failed ({r.sync_method}): its servers and {len(r.recovery)} packfs daemons killed -9 "
              f"under PUTs; {len(r.puts.during)} PUTs acknowledged from then on ({len(r.puts.acked) - len(r.puts.during)} "
              f"before, {len(r.puts.failed)} not acknowledged), with {r.handoff_copies} copies on handoff devices")
        print(f"   read while {r.node} was down: {r.read_while_down} objects, all byte for byte")
        print(f"   back: packfs mount with recovery "
              + ", ".join(f"{dev} {t:.1f}s" for dev, t in r.recovery.items())
              + f"; one replicator pass ({r.sync_method}) {r.replication.seconds:.1f}s, "
              f"{r.replication.handoffs_removed} handoff partitions moved back")
        print(f"   then {r.placement.copies} copies verified on their primary devices' files, byte for byte; "
              f"none left on a handoff" + (f" after {r.passes} passes (the first left some there)" if r.passes > 1 else ""))
    print(f"{replaced.node}/{replaced.device} replaced by an empty disk: one replicator pass (rsync) in "
          f"{replaced.replication.seconds:.1f}s restored {replaced.restored} of {replaced.expected} objects "
          f"(verified byte for byte) and "
          + (f"{replaced.databases} of {len(replaced.expected_databases)} account/container databases, those the "
             f"rings make it a primary for" if replaced.expected_databases else
             "no account/container database: the rings make it a primary for none"))
    print(f"at the end: {len(stored.objects)} acknowledged objects ({verified / 2**20:.1f} MiB) read back through "
          f"the proxy byte for byte, every container listing whole")
    errors = [e for r in rounds for e in r.replication.errors] + replaced.replication.errors
    if errors:
        print(f"the replicators and updaters logged {len(errors)} ERROR lines (in <node>/log/*-once.log), e.g.:")
        print("   " + "\n   ".join(e[:200] for e in errors[:3]))
