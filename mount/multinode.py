"""Several Swift storage nodes on one machine, each in a network namespace of its own.

Node i is a :class:`SwiftCluster` (mount/swiftcluster.py) in ``<run>/node<i>``
with nothing shared with the other nodes: its own packfs devices (``sdb1``,
``sdb2``, ... mounted at ``<run>/node<i>/srv/node/``), configs and swift_dir,
an rsync daemon and an account, container and object server on its own address
in its own network namespace (mount/netns.py), on Swift's usual ports. The
rings (3 replicas, one zone per node) are built once with swift-ring-builder
and copied to every node and to the proxy, which runs with tempauth and
memcached in the root namespace on 127.0.0.1 (``<run>/proxy``) and reaches the
nodes across the bridge.

A node can fail (its servers and packfs daemons SIGKILLed), return (dead
mounts cleared, packfs mounts again and recovers, servers restart) and have a
device replaced by an empty one; the replicators run one pass on every node at
once, and :meth:`MultiNodeCluster.placement` says where each object's copies
are, read from the devices' own files. ``<run>/multinode.json`` and each
part's cluster.json record everything, so ``make stop`` tears down what a
failed or kept run left.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns import PrivateNetwork  # noqa: E402
from swiftcluster import ClusterError, Device, SwiftCluster  # noqa: E402

NODE_SERVERS = ("account", "container", "object")
# One pass on a node: the replicators, and the object updater, which sends the container
# updates that timed out or found a container server down (async pendings), as a node
# running these daemons all the time would.
PASS_DAEMONS = ("object-replicator", "container-replicator", "account-replicator", "object-updater")
MAX_NODES = 8  # each node is ~0.4 GB of servers and daemons
T = TypeVar("T")


def on_each(fn: Callable[[T], object], items: Iterable[T]) -> list:
    """fn on every item at once (one thread each), as nodes act at once; the first error is raised."""
    items = list(items)
    with concurrent.futures.ThreadPoolExecutor(max(len(items), 1)) as ex:
        return list(ex.map(fn, items))


@dataclasses.dataclass
class ReplicationPass:
    seconds: float
    handoffs_removed: int   # handoff partitions a replicator pushed to their primaries and removed
    errors: list[str]       # the daemons' ERROR lines (a pass that succeeded may have some)


@dataclasses.dataclass
class Placement:
    """Where acknowledged objects' copies are on the live nodes' devices."""
    verified: collections.Counter   # (node, device) -> copies on a primary device, right bytes
    problems: list[str]             # a primary copy missing, doubled or with wrong bytes
    handoffs: list[str]             # a copy on a device that is not one of the object's primaries

    @property
    def copies(self) -> int:
        return sum(self.verified.values())


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class MultiNodeCluster:
    """``nodes`` storage nodes of ``devices_per_node`` packfs devices each, and a proxy;
    see the module docstring."""

    def __init__(self, run_dir: Path | str, nodes: int = 3, devices_per_node: int = 2,
                 mount_options: str = "", proxy_port: int | None = None, part_power: int = 6,
                 python: str = sys.executable, subnet: str | None = None):
        if not 3 <= nodes <= MAX_NODES:
            raise ValueError(f"a multi-node cluster has 3 to {MAX_NODES} nodes (3 replicas, a zone per node), not {nodes}")
        if not 1 <= devices_per_node <= 8:
            raise ValueError(f"devices per node: 1 to 8, not {devices_per_node}")
        self.run_dir = Path(run_dir).absolute()
        self.state_file = self.run_dir / "multinode.json"
        self.n_nodes, self.devices_per_node = nodes, devices_per_node
        self.mount_options, self.part_power, self.python = mount_options, part_power, python
        self.network = PrivateNetwork(self.run_dir, nodes, subnet)
        self.proxy = SwiftCluster(self.run_dir / "proxy", devices=(), part_power=part_power,
                                  proxy_port=proxy_port, python=python)
        self.nodes: dict[str, SwiftCluster] = {}
        if subnet:
            self._make_nodes()

    def _make_nodes(self) -> None:
        """The nodes' SwiftClusters, once the network has its addresses."""
        devices = [f"sdb{k}" for k in range(1, self.devices_per_node + 1)]
        self.nodes = {f"node{i}": SwiftCluster(self.run_dir / f"node{i}", devices=devices,
                                               mount_options=self.mount_options, part_power=self.part_power,
                                               python=self.python, ip=self.network.node_ip(i),
                                               netns=self.network.namespace(i))
                      for i in range(1, self.n_nodes + 1)}

    def _save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({**self.network.to_json(), "devices_per_node": self.devices_per_node,
                                               "mount_options": self.mount_options, "python": self.python}))

    @classmethod
    def load(cls, run_dir: Path | str) -> "MultiNodeCluster":
        """What ``run_dir/multinode.json`` and the parts' cluster.json record (for ``make stop``)."""
        run_dir = Path(run_dir).absolute()
        state = json.loads((run_dir / "multinode.json").read_text())
        c = cls(run_dir, state["nodes"], state["devices_per_node"], state["mount_options"],
                python=state["python"], subnet=state["subnet"])
        if (c.proxy.run_dir / "cluster.json").exists():
            c.proxy = SwiftCluster.load(c.proxy.run_dir)
        for name, node in c.nodes.items():
            if (node.run_dir / "cluster.json").exists():
                c.nodes[name] = SwiftCluster.load(node.run_dir)
        return c

    # ----------------------------------------------------------- lifecycle
    def setup(self) -> "MultiNodeCluster":
        """Network, devices, configs, rings, servers; all torn down again if a step fails."""
        try:
            self.network.choose_subnet()
            self._make_nodes()
            self._save()  # before anything exists: a failed or interrupted setup is found and removed
            self.network.create()
            for node in self.nodes.values():
                node.write_configs()
            on_each(lambda node: node.mount_all(), self.nodes.values())
            self.proxy.write_configs()
            self.proxy.build_rings(self.ring_devices)
            for node in self.nodes.values():
                for ring in self.proxy.etc.glob("*.ring.gz"):
                    shutil.copy2(ring, node.etc / ring.name)
            on_each(self.start_node, self.nodes)
            self.proxy.start(("proxy",), rsyncd=False)
            self.check_network()
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> list[str]:
        """Stop every process by PID, unmount every device, remove the namespaces and
        links; keeps going past errors and returns them."""
        errors = []
        for part in (self.proxy, *self.nodes.values()):
            try:
                errors += part.teardown()
            except Exception as e:
                errors.append(f"{part.run_dir.name}: {e}")
        errors += self.network.remove()
        return errors

    def ring_devices(self, server: str) -> list[str]:
        """Every node's devices, in the node's own zone."""
        return [arg for zone, node in enumerate(self.nodes.values(), 1) for arg in node.ring_devices(server, zone)]

    def start_node(self, name: str) -> None:
        self.nodes[name].start(NODE_SERVERS, memcached=False, rsyncd=True)

    def check_network(self) -> None:
        """Every node reaches every other node's rsync daemon: replication's path."""
        for i, name in enumerate(self.nodes, 1):
            for j, other in enumerate(self.nodes.values(), 1):
                if i != j and not self.network.reachable(i, other.ip, other.ports["rsync"]):
                    raise ClusterError(f"{name} cannot reach node{j} at {other.ip}:{other.ports['rsync']} across "
                                       f"bridge {self.network.bridge}: is bridged traffic filtered (br_netfilter, iptables)?")

    # ------------------------------------------------------------- clients
    def client(self, **kw):
        return self.proxy.client(**kw)

    @functools.cached_property
    def account(self) -> str:
        return self.client().get_auth()[0].rsplit("/", 1)[1]

    @functools.cached_property
    def object_ring(self):
        return self.proxy.ring("object")

    @functools.cached_property
    def account_ring(self):
        return self.proxy.ring("account")

    @functools.cached_property
    def container_ring(self):
        return self.proxy.ring("container")

    def containers(self) -> set[str]:
        """The account's containers, as its listing through the proxy says."""
        return {c["name"] for c in self.client().get_account(full_listing=True)[1]}

    # ------------------------------------------------- failures and repairs
    def fail_node(self, name: str) -> list[int]:
        """A node crashes: its servers and rsyncd are SIGKILLed, then each packfs daemon
        (kill -9 by its PID); the dead mounts stay. Returns the daemons' PIDs."""
        node = self.nodes[name]
        node.stop(sig=signal.SIGKILL)
        return [node.crash_device(dev) for dev in node.devices]

    def return_node(self, name: str) -> dict[str, float]:
        """The node comes back: dead mounts cleared (as a reboot would), each packfs mounted
        again (it replays its log: recovery after kill -9), the servers restarted.
        Returns each device's mount time in seconds."""
        node = self.nodes[name]
        times = {}
        for dev in node.devices:
            node.clear_dead_mount(dev)
            t = time.monotonic()
            node.mount_device(dev)
            times[dev.name] = time.monotonic() - t
        self.start_node(name)
        return times

    def replace_device(self, name: str, device: str) -> Device:
        """A disk is lost outright and replaced: unmounted, its pack directory removed and
        made again empty, mounted (packfs initialises it). The node's servers keep
        running, answering 507 for the device while it is away (mount_check)."""
        node = self.nodes[name]
        dev = node.device(device)
        node.umount_device(dev)
        shutil.rmtree(dev.packdir)
        dev.packdir.mkdir()
        node.mount_device(dev)
        (dev.mountpoint / "tmp").mkdir()
        return dev

    def replicate(self, sync_method: str) -> ReplicationPass:
        """One pass (``once``) of the object, container and account replicators and the
        object updater on every node at once, the object replicator with ``sync_method``
        (rsync or ssync). Each daemon's output goes to the node's log directory."""
        outputs: list[str] = []

        def on_node(node: SwiftCluster) -> None:
            for daemon in PASS_DAEMONS:
                conf = node.object_conf_variant(sync_method=sync_method) if daemon == "object-replicator" else None
                r = node.run_once(daemon, conf=conf)
                out = r.stdout + r.stderr
                with open(node.log_dir / f"{daemon}-once.log", "a") as f:
                    f.write(out)
                if r.returncode or "Traceback" in out:
                    raise ClusterError(f"{daemon} once on {node.ip} failed (rc={r.returncode}):\n{out[-3000:]}")
                outputs.append(out)

        t = time.monotonic()
        on_each(on_node, self.nodes.values())
        seconds = time.monotonic() - t
        text = "\n".join(outputs)
        return ReplicationPass(seconds, len(re.findall(r"Removing partition: ", text)),
                               [ln for ln in text.splitlines() if "ERROR" in ln])

    # ------------------------------------------------------------ placement
    def placement(self, objects: dict[tuple[str, str], str | None], down: Iterable[str] = ()) -> Placement:
        """Read every copy of ``objects`` ((container, name) -> MD5 of its bytes, or None
        to check a copy against its own ETag only, as an SLO manifest) from the devices
        of the nodes not ``down``: on each primary device, one .data whose bytes match
        its metadata's ETag and the MD5; on every other device, none (a handoff)."""
        from swift.common.utils import hash_path
        from swift.obj.diskfile import read_metadata
        ring, account, down = self.object_ring, self.account, set(down)
        verified: collections.Counter = collections.Counter()
        problems, handoffs = [], []
        for (container, obj), md5 in sorted(objects.items()):
            part, primaries = ring.get_nodes(account, container, obj)
            h = hash_path(account, container, obj)
            primary = {(n["ip"], n["device"]) for n in primaries}
            for name, node in self.nodes.items():
                if name in down:
                    continue
                for dev in node.devices:
                    where = f"{name}/{dev.name}: {container}/{obj}"
                    d = dev.mountpoint / "objects" / str(part) / h[-3:] / h
                    datas = sorted(f for f in os.listdir(d) if f.endswith(".data")) if d.is_dir() else []
                    if (node.ip, dev.name) not in primary:
                        handoffs += [f"{where} ({f})" for f in datas]
                        continue
                    if len(datas) != 1:
                        problems.append(f"{where}: {len(datas)} .data files in {d}")
                        continue
                    meta = read_metadata(str(d / datas[0]))
                    got = file_md5(d / datas[0])
                    if got != meta["ETag"] or (md5 and got != md5) or meta["name"] != f"/{account}/{container}/{obj}":
                        problems.append(f"{where}: bytes md5 {got}, its ETag {meta['ETag']}, acknowledged {md5}")
                    else:
                        verified[name, dev.name] += 1
        return Placement(verified, problems, handoffs)

    def primary_of(self, container: str, obj: str, node: str, device: str) -> bool:
        _, primaries = self.object_ring.get_nodes(self.account, container, obj)
        return any(n["ip"] == self.nodes[node].ip and n["device"] == device for n in primaries)

    def database_primaries(self, node: str, device: str, containers: Iterable[str]) -> set[str]:
        """The databases the account and container rings make ``node``/``device`` a primary
        for, of the account and of each of ``containers``: their paths in the device
        (``accounts/<part>/<suffix>/<hash>/<hash>.db``, ``containers/...``). With one zone
        per node and 3 replicas, each node holds one replica of every partition, on one of
        its devices: which one, the rebalance chose at random."""
        from swift.common.utils import hash_path
        ip, paths = self.nodes[node].ip, set()
        for ring, datadir, names in ((self.account_ring, "accounts", [()]),
                                     (self.container_ring, "containers", [(c,) for c in containers])):
            for name in names:
                part, primaries = ring.get_nodes(self.account, *name)
                if any(n["ip"] == ip and n["device"] == device for n in primaries):
                    h = hash_path(self.account, *name)
                    paths.add(f"{datadir}/{part}/{h[-3:]}/{h}/{h}.db")
        return paths

    def database_files(self, node: str, device: str) -> set[str]:
        """The account and container databases on the device, as paths in it."""
        root = self.nodes[node].device(device).mountpoint
        return {str(p.relative_to(root)) for d in ("accounts", "containers") for p in (root / d).rglob("*.db")}

    def count_files(self, node: str, device: str, dirs: Iterable[str], suffix: str) -> int:
        """Files ending in ``suffix`` under the device's ``dirs`` (objects: .data, accounts
        and containers: .db)."""
        root = self.nodes[node].device(device).mountpoint
        return sum(1 for d in dirs for _ in (root / d).rglob(f"*{suffix}"))
