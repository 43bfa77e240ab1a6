"""A stock OpenStack Swift cluster on packfs devices, for the demo and the tests.

One module owns everything a Swift-on-packfs cluster needs, so the demo
(`mount/demo.py`, `make demo`) and the tests (`tests/swift/`) share it:

* devices: one packfs per device, pack directory on the real disk
  (``<run>/packs/sdbN``), mounted at ``<node_root>/sdbN``;
* rings: account, container and object, built with ``swift-ring-builder``;
* configs: rendered from the templates in ``mount/swift/``;
* processes: memcached, an rsync daemon, proxy, account, container and object
  servers, each started in its own session, recorded by PID in
  ``<run>/cluster.json`` and stopped by that PID;
* one-shot daemons: ``swift-object-replicator CONF once`` and friends.

Everything listens on 127.0.0.1, unless the cluster is one storage node of
several (mount/multinode.py): then its servers and rsyncd listen on the node's
own address inside the node's network namespace, on Swift's usual ports, and
its one-shot daemons run there too. Swift runs as root (``user = root``).

The storage backend is ``packfs`` (real mounts, the default) or ``dir`` (plain
directories, for developing the harness without packfs, and for comparing).
Choose it with the ``backend`` argument or ``PACKFS_SWIFT_BACKEND``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEMPLATES = HERE / "swift"
SWIFTRUN = HERE / "swiftrun.py"

sys.path.insert(0, str(REPO / "tests"))
import mounts  # noqa: E402  (tests/mounts.py: the shared mount helpers)

SERVERS = ("account", "container", "object")
DEFAULT_DEVICES = ("sdb1", "sdb2", "sdb3", "sdb4")
# A storage node alone in its network namespace listens on Swift's usual ports.
NODE_PORTS = {"object": 6200, "container": 6201, "account": 6202, "rsync": 873}
EC_FRAGMENTS = 3  # swift.conf's erasure-coded policy (index 1, `ec`): its data and parity fragments, a device for each


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def packfs_available(python: str = sys.executable) -> tuple[bool, str]:
    """Whether `packfs mount` exists in this environment (the CLI answers --help)."""
    r = subprocess.run([python, "-m", "packfs.cli", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout or "packfs.cli failed").strip().splitlines()
        return False, lines[-1] if lines else "packfs.cli failed"
    if "mount" not in r.stdout:
        return False, "packfs.cli has no mount command"
    return True, ""


def alive(pid: int) -> bool:
    return mounts._alive(pid)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@dataclasses.dataclass
class Device:
    name: str
    packdir: Path
    mountpoint: Path


class ClusterError(RuntimeError):
    pass


class SwiftCluster:
    """A Swift cluster in ``run_dir``; see the module docstring."""

    def __init__(self, run_dir: Path | str, node_root: Path | str | None = None,
                 devices: Iterable[str] = DEFAULT_DEVICES, backend: str | None = None,
                 mount_options: str = "", part_power: int = 6, replicas: int = 3,
                 workers: int = 1, sync_method: str = "rsync", proxy_port: int | None = None,
                 python: str = sys.executable, ip: str = "127.0.0.1", netns: str | None = None):
        """``netns``: the named network namespace (``ip netns``) its processes run in, where
        ``ip`` is the node's address; it then keeps :data:`NODE_PORTS`."""
        self.run_dir = Path(run_dir).absolute()
        self.node_root = Path(node_root).absolute() if node_root else self.run_dir / "srv" / "node"
        self.backend = backend or os.environ.get("PACKFS_SWIFT_BACKEND", "packfs")
        if self.backend not in ("packfs", "dir"):
            raise ValueError(f"backend must be packfs or dir, not {self.backend!r}")
        self.mount_options = mount_options
        self.part_power, self.replicas, self.workers = part_power, replicas, workers
        self.sync_method = sync_method
        self.python = python
        self.ip, self.netns = ip, netns
        self.devices = [Device(n, self.run_dir / "packs" / n, self.node_root / n) for n in devices]
        self.etc = self.run_dir / "etc"
        self.log_dir = self.run_dir / "log"
        self.pid_dir = self.run_dir / "pid"
        self.cache_dir = self.run_dir / "cache"
        self.state_file = self.run_dir / "cluster.json"
        self.pids: dict[str, int] = {}
        self.mounted: list[str] = []
        self.ports = {"proxy": proxy_port or 0, "account": 0, "container": 0, "object": 0,
                      "memcached": 0, "rsync": 0}
        if netns:
            self.ports.update(NODE_PORTS)
        self._lock = threading.Lock()

    # ----------------------------------------------------------- state file
    def _save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = {"node_root": str(self.node_root), "backend": self.backend,
                 "devices": [d.name for d in self.devices], "ports": self.ports,
                 "pids": self.pids, "mounted": self.mounted, "mount_options": self.mount_options,
                 "python": self.python, "ip": self.ip, "netns": self.netns}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, run_dir: Path | str) -> "SwiftCluster":
        """The cluster recorded in ``run_dir/cluster.json`` (for ``make stop``)."""
        run_dir = Path(run_dir).absolute()
        state = json.loads((run_dir / "cluster.json").read_text())
        c = cls(run_dir, state["node_root"], state["devices"], state["backend"],
                state.get("mount_options", ""), python=state.get("python", sys.executable),
                ip=state.get("ip", "127.0.0.1"), netns=state.get("netns"))
        c.ports.update(state["ports"])
        c.pids = {k: int(v) for k, v in state["pids"].items()}
        c.mounted = list(state["mounted"])
        return c

    # ------------------------------------------------------------- devices
    def device(self, name: str) -> Device:
        return next(d for d in self.devices if d.name == name)

    def mount_device(self, dev: Device) -> None:
        dev.mountpoint.mkdir(parents=True, exist_ok=True)
        if self.backend == "dir":
            return
        dev.packdir.mkdir(parents=True, exist_ok=True)
        if mounts.is_mounted(dev.mountpoint):
            raise ClusterError(f"{dev.mountpoint} is already mounted")
        r = mounts.mount(dev.packdir, dev.mountpoint, self.mount_options, check=False)
        if r.returncode != 0 or not mounts.is_mounted(dev.mountpoint):
            mounts.force_unmount(dev.mountpoint, dev.packdir)
            raise ClusterError(f"packfs mount {dev.packdir} {dev.mountpoint} failed "
                               f"(rc={r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
        with self._lock:
            if dev.name not in self.mounted:
                self.mounted.append(dev.name)
            self._save()

    def umount_device(self, dev: Device, clean: bool = True) -> None:
        """Unmount one device: `packfs umount`, else fusermount3 -u / -z and the PID."""
        if self.backend == "dir":
            return
        try:
            if mounts.is_mounted(dev.mountpoint):
                if clean:
                    mounts.umount(dev.packdir, dev.mountpoint)
                else:
                    mounts.force_unmount(dev.mountpoint, dev.packdir)
        except Exception:
            mounts.force_unmount(dev.mountpoint, dev.packdir)
            if clean:
                raise
        finally:
            with self._lock:
                if dev.name in self.mounted and not mounts.is_mounted(dev.mountpoint):
                    self.mounted.remove(dev.name)
                self._save()

    def crash_device(self, dev: Device, timeout: float = 30) -> int:
        """SIGKILL one packfs daemon by its PID and wait for it to die. The dead mount
        stays in place (every access: ENOTCONN, so Swift's mount_check answers 507)
        until :meth:`clear_dead_mount`, as it would on a real node until someone
        unmounts it. Returns the PID killed."""
        if self.backend == "dir":
            raise ClusterError("crashing a device needs the packfs backend")
        pid = mounts.daemon_pid(dev.packdir)
        if not pid or not alive(pid):
            raise ClusterError(f"no live packfs daemon for {dev.name} (pid file: {pid})")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if alive(pid):
            raise ClusterError(f"packfs daemon {pid} of {dev.name} survived SIGKILL for {timeout}s")
        return pid

    def clear_dead_mount(self, dev: Device) -> None:
        """Take a dead mount away (fusermount3 -u, then -z)."""
        mounts.force_unmount(dev.mountpoint)
        with self._lock:
            if dev.name in self.mounted and not mounts.is_mounted(dev.mountpoint):
                self.mounted.remove(dev.name)
            self._save()

    def kill9_device(self, dev: Device) -> None:
        """Crash one packfs daemon (SIGKILL by its PID) and clear the dead mount."""
        self.crash_device(dev)
        self.clear_dead_mount(dev)

    def mount_all(self) -> None:
        for dev in self.devices:
            self.mount_device(dev)
        # Swift expects these at the top of each device.
        for dev in self.devices:
            (dev.mountpoint / "tmp").mkdir(exist_ok=True)

    def umount_all(self, clean: bool = True) -> list[str]:
        errors = []
        for dev in self.devices:
            try:
                self.umount_device(dev, clean=clean)
            except Exception as e:  # keep going: every mount must come down
                errors.append(f"{dev.name}: {e}")
        return errors

    def stats(self, dev: Device) -> str:
        if self.backend == "dir":
            return "(plain directory: no packfs stats)"
        r = subprocess.run([self.python, "-m", "packfs.cli", "stats", str(dev.mountpoint)],
                           capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip()

    # ------------------------------------------------------------- configs
    @property
    def mount_check(self) -> bool:
        """Real mounts: let Swift check them (a dead FUSE mount then reads as 507)."""
        return self.backend == "packfs"

    def conf(self, server: str) -> Path:
        return self.etc / f"{server}-server.conf"

    def _allocate_ports(self) -> None:
        if self.netns:
            return  # NODE_PORTS: nothing else listens in the node's namespace
        taken = set()
        for k, v in self.ports.items():
            if not v or not port_is_free(v):
                p = free_port()
                while p in taken:
                    p = free_port()
                self.ports[k] = p
            taken.add(self.ports[k])

    def write_configs(self, sync_method: str | None = None) -> None:
        for d in (self.etc, self.log_dir, self.pid_dir, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._allocate_ports()
        values = {
            "swift_dir": str(self.etc), "devices": str(self.node_root), "bind_ip": self.ip,
            "mount_check": "true" if self.mount_check else "false",
            "workers": str(self.workers), "recon_cache_path": str(self.cache_dir),
            "sync_method": sync_method or self.sync_method, "run_dir": str(self.run_dir),
            "log_dir": str(self.log_dir),
            **{f"{k}_port": str(v) for k, v in self.ports.items()},
        }
        for tpl in TEMPLATES.glob("*.conf.in"):
            text = string.Template(tpl.read_text()).substitute(values)
            (self.etc / tpl.name[:-3]).write_text(text)
        self._save()

    def object_conf_variant(self, **overrides: str) -> Path:
        """A copy of object-server.conf with [object-replicator] etc. settings changed
        (e.g. sync_method=ssync), for one-shot daemon runs."""
        import configparser
        cp = configparser.RawConfigParser()
        cp.optionxform = str
        cp.read(self.conf("object"))
        name = []
        for key, value in overrides.items():
            section, _, option = key.rpartition(".")
            cp.set(section or "object-replicator", option, value)
            name.append(f"{option}-{value}")
        path = self.etc / f"object-server.{'.'.join(name) or 'copy'}.conf"
        with open(path, "w") as f:
            cp.write(f)
        return path

    # --------------------------------------------------------------- rings
    def ring_devices(self, server: str, zone: int | None = None) -> list[str]:
        """This cluster's devices as ``swift-ring-builder add`` arguments for one server's
        ring: each device in a zone of its own, or all of them in ``zone`` (a node's)."""
        adds = []
        for i, dev in enumerate(self.devices, 1):
            adds += [f"r1z{zone or i}-{self.ip}:{self.ports[server]}/{dev.name}", "100"]
        return adds

    def build_rings(self, ring_devices: Callable[[str], list[str]] | None = None) -> None:
        """account, container and object rings (part power, replicas), and object-1's
        for the erasure-coded policy (EC_FRAGMENTS fragments, a device for each), in
        this cluster's swift_dir. ``ring_devices(server)`` gives each ring's devices
        (default: :meth:`ring_devices`, one zone per device)."""
        ring_devices = ring_devices or self.ring_devices
        errors: list[str] = []

        def build(ring: str, server: str, replicas: int) -> None:
            builder = self.etc / f"{ring}.builder"
            for f in (builder, self.etc / f"{ring}.ring.gz"):
                f.unlink(missing_ok=True)
            for args, ok in (([ "create", str(self.part_power), str(replicas), "1"], (0,)),
                             (["add", *ring_devices(server)], (0,)),
                             (["rebalance"], (0, 1))):
                r = self.swift("swift-ring-builder", str(builder), *args)
                if r.returncode not in ok:
                    errors.append(f"swift-ring-builder {ring} {args[0]}: rc={r.returncode}\n{r.stdout}{r.stderr}")
                    return

        rings = [(s, s, self.replicas) for s in SERVERS] + [("object-1", "object", EC_FRAGMENTS)]
        threads = [threading.Thread(target=build, args=r) for r in rings]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise ClusterError("\n".join(errors))

    def use_swift_conf(self) -> None:
        """Make Swift's modules in *this* process use the cluster's swift.conf (hash
        prefix/suffix for ring lookups and hash_path, storage policies)."""
        import swift.common.utils as utils
        from swift.common import storage_policy
        utils.SWIFT_CONF_FILE = str(self.etc / "swift.conf")
        utils.HASH_PATH_SUFFIX = utils.HASH_PATH_PREFIX = b""
        utils.validate_hash_conf()
        storage_policy.reload_storage_policies()

    def ring(self, server: str = "object"):
        from swift.common.ring import Ring
        self.use_swift_conf()
        return Ring(str(self.etc), ring_name=server)

    # ----------------------------------------------------------- processes
    def in_netns(self, argv: list[str]) -> list[str]:
        """``argv`` run in the cluster's network namespace, if it has one. nsenter enters
        the network namespace only (``ip netns exec`` would also give the process a
        mount namespace of its own, blind to packfs mounts made after it started)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv] if self.netns else argv

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PACKFS_SWIFT_CONF"] = str(self.etc / "swift.conf")
        env["TMPDIR"] = str(self.run_dir / "tmp")
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        return env

    def swift(self, script: str, *args: str, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
        """Run a stock Swift console script in the foreground (one-shot tools)."""
        r = subprocess.run(self.in_netns([self.python, str(SWIFTRUN), script, *args]), capture_output=True,
                           text=True, env=self.env(), timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"{script} {' '.join(args)} failed rc={r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def _spawn(self, name: str, argv: list[str]) -> int:
        log = open(self.log_dir / f"{name}.log", "ab")
        try:
            p = subprocess.Popen(self.in_netns(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=self.env(), start_new_session=True, cwd=self.run_dir)
        finally:
            log.close()
        with self._lock:
            self.pids[name] = p.pid
            self._save()
        self._popen = getattr(self, "_popen", {})
        self._popen[name] = p
        return p.pid

    def _wait_port(self, name: str, port: int, timeout: float = 60, path: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        pid = self.pids[name]
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through $http_proxy
        while time.monotonic() < deadline:
            if not alive(pid):
                raise ClusterError(f"{name} (pid {pid}) exited; see {self.log_dir / (name + '.log')}:\n"
                                   + self.log_tail(name))
            try:
                if path:
                    with direct.open(f"http://{self.ip}:{port}{path}", timeout=5) as r:
                        if r.status == 200:
                            return
                else:
                    with socket.create_connection((self.ip, port), timeout=1):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise ClusterError(f"{name} did not answer on {self.ip}:{port} within {timeout}s:\n" + self.log_tail(name))

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start_memcached(self) -> None:
        self._spawn("memcached", ["memcached", "-l", "127.0.0.1", "-p", str(self.ports["memcached"]),
                                  "-U", "0", "-u", "root", "-m", "64"])

    def start_rsyncd(self) -> None:
        self._spawn("rsyncd", ["rsync", "--daemon", "--no-detach", f"--config={self.etc / 'rsyncd.conf'}",
                               f"--address={self.ip}", f"--port={self.ports['rsync']}"])

    def start_server(self, server: str) -> None:
        self._spawn(f"{server}-server", [self.python, str(SWIFTRUN), f"swift-{server}-server",
                                         str(self.conf(server)), "-v"])

    def start(self, servers: Iterable[str] = ("proxy", "account", "container", "object"),
              memcached: bool = True, rsyncd: bool = True) -> None:
        servers = list(servers)
        if memcached and "proxy" in servers:
            self.start_memcached()
        if rsyncd:
            self.start_rsyncd()
        for s in servers:
            self.start_server(s)
        if memcached and "proxy" in servers:
            self._wait_port("memcached", self.ports["memcached"])
        if rsyncd:
            self._wait_port("rsyncd", self.ports["rsync"])
        for s in servers:
            self._wait_port(f"{s}-server", self.ports[s], path="/healthcheck")

    def _ours(self, name: str, pid: int) -> bool:
        """Guard against PID reuse: the process must still be the one we started."""
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        if name in ("memcached", "rsyncd"):
            return str(self.ports["memcached" if name == "memcached" else "rsync"]) in cmd or str(self.etc) in cmd
        return str(self.etc) in cmd

    def stop_process(self, name: str, timeout: float = 15, sig: int = signal.SIGTERM) -> None:
        """Stop one process and its group by the PID we recorded: ``sig`` (SIGKILL: a
        crash), then SIGKILL after ``timeout``."""
        pid = self.pids.get(name)
        if not pid:
            return
        if alive(pid) and self._ours(name, pid):
            # Each process leads its own session/group (start_new_session), so
            # the group id is the PID we recorded: this also reaches Swift's workers.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + timeout
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        # Wait for worker processes of the group too (they hold files in the mounts).
        deadline = time.monotonic() + timeout
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_members(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        p = getattr(self, "_popen", {}).pop(name, None)
        if p is not None:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        with self._lock:
            self.pids.pop(name, None)
            self._save()

    def stop(self, names: Iterable[str] | None = None, sig: int = signal.SIGTERM) -> None:
        order = ["proxy-server", "object-server", "container-server", "account-server", "rsyncd", "memcached"]
        targets = list(names) if names is not None else [n for n in order if n in self.pids] + \
            [n for n in self.pids if n not in order]
        for name in targets:
            self.stop_process(name, sig=sig)

    def restart_server(self, server: str) -> None:
        self.stop_process(f"{server}-server")
        self.start_server(server)
        self._wait_port(f"{server}-server", self.ports[server], path="/healthcheck")

    # ----------------------------------------------------------- lifecycle
    def setup(self, servers: Iterable[str] = ("proxy", "account", "container", "object"),
              rsyncd: bool = True) -> "SwiftCluster":
        """Mount the devices, write configs, build rings and start Swift."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.write_configs()
            self.mount_all()
            self.build_rings()
            self.start(servers, rsyncd=rsyncd)
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> list[str]:
        """Stop every process we started (by PID) and unmount every device."""
        self.stop()
        errors = self.umount_all()
        if self.backend == "packfs":
            # A device recorded as mounted by a previous run (state file) too.
            for dev in self.devices:
                if mounts.is_mounted(dev.mountpoint):
                    mounts.force_unmount(dev.mountpoint, dev.packdir)
        self.mounted = [d.name for d in self.devices if self.backend == "packfs" and mounts.is_mounted(d.mountpoint)]
        self._save()
        return errors

    def __enter__(self) -> "SwiftCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def run_once(self, daemon: str, *args: str, conf: Path | None = None,
                 timeout: float = 600) -> subprocess.CompletedProcess:
        """One pass of a Swift daemon, e.g. run_once('object-replicator', '--devices=sdb1')."""
        server = daemon.split("-")[0]
        conf = conf or self.conf(server)
        return self.swift(f"swift-{daemon}", str(conf), "once", "-v", *args, timeout=timeout)

    # ------------------------------------------------------------- clients
    @property
    def proxy_url(self) -> str:
        return f"http://{self.ip}:{self.ports['proxy']}"

    @property
    def auth_url(self) -> str:
        return f"{self.proxy_url}/auth/v1.0"

    def client(self, user: str = "test:tester", key: str = "testing", **kw):
        import swiftclient
        return swiftclient.Connection(self.auth_url, user, key, retries=kw.pop("retries", 2), **kw)

    def object_node(self, device: str) -> dict:
        """A ring-style node dict for direct_client calls to one device."""
        return {"ip": self.ip, "port": self.ports["object"], "device": device,
                "replication_ip": self.ip, "replication_port": self.ports["object"]}

    def clean_node_root(self) -> None:
        """Empty the (plain) device directories; only for the dir backend."""
        if self.backend == "dir":
            for dev in self.devices:
                shutil.rmtree(dev.mountpoint, ignore_errors=True)
