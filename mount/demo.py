#!/usr/bin/env python3
"""make demo: stock OpenStack Swift on four packfs devices, end to end.

    demo.py [--run-dir run/demo] [--node-root DIR] [--keep] [--backend packfs|dir]
    demo.py --nodes 3 [--run-dir run/demo] [--keep]      (make demo NODES=3)
    demo.py --stop [--run-dir run/demo]

Mounts four packfs devices (``<run>/packs/sdbN`` on the real disk, mounted at
``<node_root>/sdbN``), builds 3-replica rings, starts memcached, an rsync
daemon and stock Swift (proxy with tempauth, account, container and object
servers) on 127.0.0.1, then drives it with python-swiftclient: many small
objects, a large chunked upload, a large content-length upload and an SLO,
byte-for-byte verification, a listing and deletes, and objects in an
erasure-coded policy. Then one pass each of the object replicator, reconstructor,
auditor and updater, and a summary with ``packfs stats`` for
each device. Everything it started is stopped by PID and unmounted, unless
``--keep``; then ``--stop`` (``make stop``) tears it down.

With ``--nodes N`` (3 or more) it runs N storage nodes instead, each in a network
namespace of its own, and takes them through a node's failure and return and a
replaced disk: mount/multinode_demo.py.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multinode_demo  # noqa: E402
from multinode import MultiNodeCluster  # noqa: E402
from swiftcluster import REPO, SwiftCluster, mounts, port_is_free  # noqa: E402
from workload import Phase, Stored, workload  # noqa: E402

DAEMON_LINES = re.compile(r"(replicated|successes|suffixes|Object audit|passed|quarantined|"
                          r"Object update|complete|errors|failures)", re.I)


def run_daemons(c: SwiftCluster, phases: list) -> list[tuple[str, int, list[str]]]:
    out = []
    # container-updater too, so that account listings show the objects (`swift stat`).
    for daemon in ("object-replicator", "object-reconstructor", "object-auditor", "object-updater",
                   "container-updater"):
        with Phase(phases, f"{daemon} once"):
            r = c.run_once(daemon)
        lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if DAEMON_LINES.search(ln)]
        bad = [ln for ln in (r.stdout + r.stderr).splitlines() if "Traceback" in ln or "ERROR" in ln]
        out.append((daemon, r.returncode, lines[-4:]))
        print(f"   rc={r.returncode}; " + "\n   ".join(lines[-4:]))
        if r.returncode != 0 or bad:
            print("\n".join(bad[:20]))
            raise SystemExit(f"{daemon} failed (rc={r.returncode}); log:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return out


def stop(run_dir: Path) -> int:
    """Tear down what a kept or failed run recorded in run_dir, single- or multi-node."""
    if (run_dir / "multinode.json").exists():
        c: SwiftCluster | MultiNodeCluster = MultiNodeCluster.load(run_dir)
    elif (run_dir / "cluster.json").exists():
        c = SwiftCluster.load(run_dir)
    else:
        print(f"nothing recorded in {run_dir} (cluster.json, multinode.json): nothing to stop")
        return 0
    errors = c.teardown()
    print(f"stopped the cluster in {run_dir}" + (f"; errors: {errors}" if errors else ""))
    return 1 if errors else 0


RUN_PARTS = ("packs", "etc", "log", "cache", "pid", "tmp", "srv", "cluster.json")  # what a cluster makes there


def mounted_under(run_dir: Path) -> list[str]:
    with open("/proc/mounts") as f:
        return [t for t in (line.split()[1] for line in f) if t.startswith(f"{run_dir}/")]


def remove_run_dir(run_dir: Path, parts: tuple[str, ...]) -> None:
    """A passed demo leaves nothing behind (its packs are ~400 MB); a failed one keeps all
    to be looked at, and KEEP=1 the running cluster. Only what the cluster made goes (RUN_DIR
    may be any directory), and never through a mount."""
    under = mounted_under(run_dir)
    if under:
        print(f"left {run_dir} in place: {', '.join(under)} still mounted")
        return
    for part in parts:
        path = run_dir / part
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # if the demo's parts were all it held
    print(f"removed the demo's packs and logs from {run_dir} (make demo KEEP=1 keeps them)")


def single_node(c: SwiftCluster, args: argparse.Namespace, phases: list) -> Callable[[], None]:
    """The four-device demo's workload and daemons; returns what prints its summary."""
    print(f"   proxy {c.proxy_url}, devices under {c.node_root}, logs in {c.log_dir}")
    stored = workload(c.client, args.small, args.large_mib, args.slo_segments, 1, args.threads, phases)
    daemons = run_daemons(c, phases)
    return lambda: single_node_summary(c, stored, daemons, args.keep)


def single_node_summary(c: SwiftCluster, stored: Stored, daemons: list, keep: bool) -> None:
    print(f"backend: {c.backend}; devices: {', '.join(str(d.mountpoint) for d in c.devices)}")
    print(f"stored: {len(stored.objects)} objects (SLO segments included), {stored.bytes / 2**20:.1f} MiB "
          f"(x3 replicas), verified {stored.verified_bytes / 2**20:.1f} MiB byte for byte, "
          f"deleted {stored.deleted}; {stored.ec_objects} erasure-coded objects")
    for name, rc, _ in daemons:
        print(f"{name} once: rc={rc}")
    for d in c.devices:
        stats = c.stats(d)
        lines = stats.splitlines()
        head = lines[:next((i for i, ln in enumerate(lines) if ln.startswith("operation")), len(lines))]
        ops = [ln for ln in lines if ln.split()[:1] in (["operation"], ["fsync"], ["fsyncdir"],
                                                       ["write"], ["read"], ["disk_flush"])]
        if keep:
            full = c.log_dir / f"packfs-stats-{d.name}.txt"
            full.write_text(stats + "\n")
            print(f"--- packfs stats {d.mountpoint}   (all operations: {full})")
        else:
            print(f"--- packfs stats {d.mountpoint}   (all operations: make demo KEEP=1 keeps them)")
        print("\n".join(ln for ln in head + ops if ln.strip()))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default=str(REPO / "run" / "demo"))
    ap.add_argument("--nodes", type=int, default=1,
                    help="storage nodes: 1 (four devices on 127.0.0.1), or 3 to 8, each in a network namespace "
                         "of its own with 2 devices (node failure, recovery, a replaced disk)")
    ap.add_argument("--node-root", default=None, help="mount the devices here (e.g. /srv/node); one node only")
    ap.add_argument("--backend", default=None, choices=["packfs", "dir"])
    ap.add_argument("--mount-options", default=os.environ.get("PACKFS_OPTIONS", "noatime"),
                    help="-o options of every packfs device (default noatime, as Swift devices are mounted)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--stop", action="store_true", help="tear down a kept cluster")
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--large-mib", type=int, default=16)
    ap.add_argument("--slo-segments", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--failure-puts", type=int, default=200,
                    help="with --nodes: PUTs acknowledged while each failed node is down")
    args = ap.parse_args()
    if args.nodes != 1:
        if args.node_root:
            raise SystemExit("demo.py: --node-root is for one node; each of several mounts its devices "
                             "under RUN_DIR/nodeN/srv/node")
        if args.backend == "dir":
            raise SystemExit("demo.py: several nodes need packfs devices (their daemons are killed and recover)")
        multinode_demo.check_args(args)
    for name in ("small", "large_mib", "slo_segments", "threads", "failure_puts"):
        if getattr(args, name) < 1:
            raise SystemExit(f"demo.py: --{name.replace('_', '-')} must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    run_dir = Path(args.run_dir).absolute()
    if args.stop:
        return stop(run_dir)
    # SIGTERM unwinds like Ctrl-C, so that the teardown below still runs.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))

    if (run_dir / "cluster.json").exists() or (run_dir / "multinode.json").exists():
        print(f"tearing down what a previous run left in {run_dir}")
        stop(run_dir)
    if mounted_under(run_dir):
        raise SystemExit(f"demo.py: {', '.join(mounted_under(run_dir))} still mounted; make stop, or unmount it")
    proxy_port = 8080 if port_is_free(8080) else None
    c: SwiftCluster | MultiNodeCluster
    if args.nodes == 1:
        for sub in ("packs", "etc", "log", "cache", "pid", "tmp"):
            shutil.rmtree(run_dir / sub, ignore_errors=True)
        c = proxy = SwiftCluster(run_dir, args.node_root, backend=args.backend, mount_options=args.mount_options,
                                 proxy_port=proxy_port)
        if c.backend == "dir":
            c.clean_node_root()
        for d in c.devices:
            if c.backend == "packfs" and mounts.is_mounted(d.mountpoint):
                raise SystemExit(f"{d.mountpoint} is mounted already; unmount it first")
        parts, scenario = RUN_PARTS, single_node
        what = f"mount {len(c.devices)} {c.backend} devices, build rings, start Swift"
    else:
        c = MultiNodeCluster(run_dir, args.nodes, mount_options=args.mount_options, proxy_port=proxy_port)
        proxy = c.proxy
        parts = multinode_demo.run_parts(c)
        for part in parts:
            shutil.rmtree(run_dir / part, ignore_errors=True)
        scenario = multinode_demo.run
        what = (f"{args.nodes} nodes, each in a network namespace with {c.devices_per_node} packfs devices, "
                f"rsyncd and servers; rings; proxy")
    phases: list[tuple[str, float]] = []
    t0 = time.monotonic()
    ok, errors = False, []
    try:
        with Phase(phases, what):
            c.setup()
        summary = scenario(c, args, phases)
        total = time.monotonic() - t0
        print("\n================ summary ================")
        summary()
        print("time per phase:")
        for name, dt in phases:
            print(f"  {dt:7.1f}s  {name}")
        print(f"  {total:7.1f}s  total")
        ok = True
    finally:
        if ok and args.keep:
            print(f"\nThe cluster keeps running (proxy {proxy.proxy_url}). Reach it with:\n"
                  f"  export ST_AUTH={proxy.auth_url} ST_USER=test:tester ST_KEY=testing\n"
                  f"  {REPO / '.venv/bin/swift'} stat; {REPO / '.venv/bin/swift'} list demo\n"
                  f"Stop it with: make stop" + ("" if run_dir == REPO / "run" / "demo" else f" RUN_DIR={run_dir}"))
        else:
            with Phase(phases, "stop everything by PID, unmount" + (", remove the network" if args.nodes > 1 else "")):
                errors = c.teardown()
            if errors:
                print("teardown errors:", errors)
            elif ok:
                remove_run_dir(run_dir, parts)
        print("demo OK" if ok and not errors else f"demo FAILED; its packs and logs are in {run_dir}")
    return 0 if ok and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
