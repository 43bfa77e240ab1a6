"""A private network for storage nodes on one machine: a network namespace per node.

A bridge in the root namespace holds the first address of a private /24 (the proxy
reaches the nodes from there); each node's namespace gets a veth pair, one end on
the bridge and the other, ``eth0`` in the namespace, with the node's address. Nodes
reach each other across the bridge (replication) and nothing is routed off the
machine: no forwarding, no NAT, no default route in the namespaces.

Every name carries a tag derived from the run directory, so a later run (or
``make stop``) finds what an earlier one made and removes it, and two run
directories never share a namespace or a link.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

# Private /24s to choose from: the first one no route or address of this machine touches.
CANDIDATE_SUBNETS = [ipaddress.ip_network(f"10.89.{k}.0/24") for k in range(1, 255)]
FIRST_NODE_HOST = 11  # node1 is .11, node2 .12, ...


class NetworkError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool, pkg in (("ip", "iproute2"), ("nsenter", "util-linux")) if not shutil.which(tool)]
    return f"network namespaces need {' and '.join(missing)} (apt-get install iproute2 util-linux)" if missing else None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise NetworkError(f"ip {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and address of the root namespace, as networks."""
    nets = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            nets.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


class PrivateNetwork:
    """The bridge, namespaces and veth pairs of ``nodes`` storage nodes; see the module docstring."""

    def __init__(self, run_dir: Path, nodes: int, subnet: str | None = None):
        self.tag = hashlib.sha1(str(Path(run_dir).absolute()).encode()).hexdigest()[:6]
        self.nodes = nodes
        self.subnet = ipaddress.ip_network(subnet) if subnet else None
        self.bridge = f"pf{self.tag}br"

    def namespace(self, i: int) -> str:
        return f"packfs-{self.tag}-node{i}"

    def host_link(self, i: int) -> str:
        """The root namespace's end of node i's veth pair (at most 15 characters)."""
        return f"pf{self.tag}n{i}"

    def node_ip(self, i: int) -> str:
        return str(self.subnet[FIRST_NODE_HOST + i - 1])

    @property
    def host_ip(self) -> str:
        return str(self.subnet[1])

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "subnet": str(self.subnet) if self.subnet else None}

    def choose_subnet(self) -> None:
        used = used_networks()
        free = next((n for n in CANDIDATE_SUBNETS if not any(n.overlaps(u) for u in used)), None)
        if free is None:
            raise NetworkError("no free private /24 under 10.89.0.0/16 for the nodes' network")
        self.subnet = free

    def create(self) -> None:
        """Make the bridge and, per node, its namespace, veth pair and address. The
        caller records :meth:`to_json` first and calls :meth:`remove` on failure."""
        if self.subnet is None:
            self.choose_subnet()
        prefix = self.subnet.prefixlen
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/{prefix}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, link = self.namespace(i), self.host_link(i)
            ip("netns", "add", ns)
            ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", link, "master", self.bridge, "up")
            ip("-n", ns, "addr", "add", f"{self.node_ip(i)}/{prefix}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def remove(self) -> list[str]:
        """Delete every namespace (its veth pair goes with it) and the bridge that exist;
        returns what could not be deleted."""
        errors = []
        existing = set(ip("netns", "list", check=False).stdout.split())
        for i in range(1, self.nodes + 1):
            ns, link = self.namespace(i), self.host_link(i)
            if ns in existing:
                r = ip("netns", "del", ns, check=False)
                if r.returncode:
                    errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
            if ip("link", "show", link, check=False).returncode == 0:  # its namespace is gone, or never got it
                ip("link", "del", link, check=False)
        if ip("link", "show", self.bridge, check=False).returncode == 0:
            r = ip("link", "del", self.bridge, check=False)
            if r.returncode:
                errors.append(f"ip link del {self.bridge}: {r.stderr.strip()}")
        return errors

    def reachable(self, i: int, address: str, port: int) -> bool:
        """Whether node i's namespace can open a TCP connection to address:port."""
        r = subprocess.run(["nsenter", f"--net=/run/netns/{self.namespace(i)}", "timeout", "5",
                            "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"], capture_output=True)
        return r.returncode == 0
