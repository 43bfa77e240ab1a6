"""One stock Swift object server per filesystem, and a small HTTP load generator.

The object server is the unmodified ``swift-object-server`` console script from PyPI, with
a minimal config written here: ``devices`` is the filesystem's Swift ``devices`` dir (the
filesystem under test is mounted at ``devices/sdb1``), ``workers`` (BENCH_SWIFT_WORKERS,
1), ``network_chunk_size`` (BENCH_SWIFT_NETWORK_CHUNK, 65536), ``mount_check = false``,
and ``swift_dir`` pointing at a run-directory swift.conf (Swift's run_wsgi calls
``set_swift_dir`` with it, so nothing is written to /etc/swift).  An object ring with one
device is built with Swift's own RingBuilder.

Why not mount/swiftcluster.py: that module runs a whole cluster (proxy, account,
container, rsync) on packfs mounts it creates itself; the benchmark needs exactly one
object server on each of three filesystems it has mounted, XFS and ext4 included.

The load generator talks HTTP/1.1 over raw keep-alive sockets (one per client thread)
straight to the object server: ``PUT /sdb1/<part>/<a>/<c>/<o>`` with X-Timestamp and
Content-Type, body by Content-Length or chunked.  It is deliberately lighter than
http.client, because it shares two cores with the server and the FUSE daemon.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .util import latency_summary, log, pids_in_group

# Object server worker processes: 1 by default (every request on one eventlet hub, as
# the tables so far were measured); Swift's own default is "auto", one per core.
WORKERS = os.environ.get("BENCH_SWIFT_WORKERS", "1")
# Bytes the object server reads from a client at a time, and so writes to its file at a
# time during a PUT: Swift's default, 65536, unless BENCH_SWIFT_NETWORK_CHUNK says (the
# same for every filesystem of a run). Through FUSE each write is a round trip.
NETWORK_CHUNK = os.environ.get("BENCH_SWIFT_NETWORK_CHUNK", "65536")
if not NETWORK_CHUNK.isdigit() or int(NETWORK_CHUNK) == 0:
    raise SystemExit(f"BENCH_SWIFT_NETWORK_CHUNK={NETWORK_CHUNK!r}: give a size in bytes, such as 1048576")
HASH_SUFFIX = "packfs-bench-suffix"
HASH_PREFIX = "packfs-bench-prefix"
PART_POWER = 10
ACCOUNT, CONTAINER = "AUTH_bench", "bench"
DEVICE = "sdb1"

_SWIFT_CONF = f"""[swift-hash]
swift_hash_path_suffix = {HASH_SUFFIX}
swift_hash_path_prefix = {HASH_PREFIX}

[storage-policy:0]
name = Policy-0
default = yes
"""

_OBJ_CONF = """[DEFAULT]
devices = {devices}
mount_check = false
bind_ip = 127.0.0.1
bind_port = {port}
workers = {workers}
user = root
swift_dir = {swift_dir}
log_name = object-server-{name}
log_level = WARNING
network_chunk_size = {network_chunk}
disk_chunk_size = 65536

[pipeline:main]
pipeline = object-server

[app:object-server]
use = egg:swift#object
log_requests = false

[object-replicator]
[object-auditor]
[object-updater]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def swift_bin(name: str) -> str:
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


def write_swift_dir(swift_dir: Path, port: int) -> None:
    swift_dir.mkdir(parents=True, exist_ok=True)
    (swift_dir / "swift.conf").write_text(_SWIFT_CONF)
    ring = swift_dir / "object.ring.gz"
    if not ring.exists():
        from swift.common.ring import RingBuilder
        b = RingBuilder(PART_POWER, 1, 1)
        b.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": port,
                   "device": DEVICE, "weight": 100.0, "meta": ""})
        b.rebalance()
        b.get_ring().save(str(ring))


def object_location(obj: str, account: str = ACCOUNT, container: str = CONTAINER) -> tuple[int, str]:
    """(partition, hash) exactly as Swift computes them with this swift.conf."""
    name = f"/{account}/{container}/{obj}".encode()
    h = hashlib.md5(HASH_PREFIX.encode() + name + HASH_SUFFIX.encode()).digest()
    part = int.from_bytes(h[:4], "big") >> (32 - PART_POWER)
    return part, h.hex()


@dataclass
class ObjectServer:
    name: str
    devices: Path
    swift_dir: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    logfile: Path | None = None

    def start(self, timeout: float = 60) -> None:
        self.port = self.port or free_port()
        write_swift_dir(self.swift_dir, self.port)
        conf = self.swift_dir / "object-server.conf"
        conf.write_text(_OBJ_CONF.format(devices=self.devices, port=self.port,
                                         swift_dir=self.swift_dir, name=self.name, workers=WORKERS,
                                         network_chunk=NETWORK_CHUNK))
        self.logfile = self.swift_dir / "object-server.log"
        with open(self.logfile, "ab") as lf:
            self.proc = subprocess.Popen([swift_bin("swift-object-server"), str(conf)],
                                         stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"object server for {self.name} exited: {self.log_tail()}")
            try:
                c = Conn(self.port)
                st, _ = c.request("HEAD", f"/{DEVICE}/0/{ACCOUNT}/{CONTAINER}/ping")
                c.close()
                if st in (404, 200):
                    # wait for the worker too (workers=1 forks one child)
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"object server for {self.name} did not come up: {self.log_tail()}")

    def pids(self) -> list[int]:
        return pids_in_group(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def worker_pids(self) -> list[int]:
        """The processes that serve requests: the workers (the parent only waits), or the
        parent if it has none (`workers = 0`)."""
        pids = self.pids()
        return [pid for pid in pids if pid != self.proc.pid] or pids  # type: ignore[union-attr]

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        # a worker may outlive its parent for a moment
        for pid in pids_in_group(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class HTTPError(RuntimeError):
    pass


class Conn:
    """A minimal HTTP/1.1 keep-alive client over one socket."""

    RBUF = 1 << 20

    def __init__(self, port: int):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=300)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.rbuf = bytearray(self.RBUF)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def request(self, method: str, path: str, headers: dict | None = None, body=None,
                body_len: int = 0, chunked: int = 0) -> tuple[int, int]:
        """Send a request; body is a bytes-like object repeated to body_len bytes.
        With chunked=N the body goes out with Transfer-Encoding: chunked in N-byte pieces.
        Returns (status, body bytes received)."""
        h = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        for k, v in (headers or {}).items():
            h.append(f"{k}: {v}")
        if body is not None:
            h.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {body_len}")
        elif method in ("PUT", "POST"):
            h.append("Content-Length: 0")
        head = ("\r\n".join(h) + "\r\n\r\n").encode()
        s = self.sock
        if body is None:
            s.sendall(head)
        elif chunked:
            s.sendall(head)
            mv = memoryview(body)
            left = body_len
            pos = 0
            while left > 0:
                n = min(chunked, left)
                if pos + n > len(mv):
                    pos = 0
                s.sendmsg([f"{n:x}\r\n".encode(), mv[pos:pos + n], b"\r\n"])
                pos += n
                left -= n
            s.sendall(b"0\r\n\r\n")
        else:
            mv = memoryview(body)
            if body_len <= len(mv):
                s.sendmsg([head, mv[:body_len]])
            else:
                s.sendall(head)
                left = body_len
                while left > 0:
                    n = min(len(mv), left)
                    s.sendall(mv[:n])
                    left -= n
        return self._response(method)

    def _fill(self) -> None:
        n = self.sock.recv_into(self.rbuf)
        if not n:
            raise HTTPError("connection closed")
        self.buf += memoryview(self.rbuf)[:n]

    def _response(self, method: str) -> tuple[int, int]:
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                break
            self._fill()
        head = bytes(self.buf[:i]).decode("latin1").split("\r\n")
        del self.buf[:i + 4]
        status = int(head[0].split()[1])
        hdrs = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if status == 100:
            return self._response(method)
        got = 0
        if method == "HEAD" or status in (204, 304):
            pass
        elif "content-length" in hdrs:
            need = int(hdrs["content-length"])
            take = min(need, len(self.buf))
            del self.buf[:take]
            got = take
            while got < need:
                n = self.sock.recv_into(self.rbuf, min(self.RBUF, need - got))
                if not n:
                    raise HTTPError("connection closed in body")
                got += n
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in self.buf:
                    self._fill()
                j = self.buf.find(b"\r\n")
                n = int(bytes(self.buf[:j]).split(b";")[0], 16)
                del self.buf[:j + 2]
                while len(self.buf) < n + 2:
                    self._fill()
                del self.buf[:n + 2]
                got += n
                if n == 0:
                    break
        if hdrs.get("connection", "").lower() == "close":
            self.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=300)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = bytearray()
        return status, got


_ts_lock = threading.Lock()
_ts_last = [0.0]


def next_ts() -> str:
    """Unique, increasing Swift timestamps (X-Timestamp) for this process."""
    with _ts_lock:
        t = max(time.time(), _ts_last[0] + 1e-5)
        _ts_last[0] = t
        return f"{t:016.5f}"


def obj_path(obj: str) -> str:
    part, _ = object_location(obj)
    return f"/{DEVICE}/{part}/{ACCOUNT}/{CONTAINER}/{obj}"


@dataclass
class Phase:
    """Result of one load phase."""
    ops: int = 0
    seconds: float = 0.0
    lat: list = field(default_factory=list)
    errors: int = 0
    bytes: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        return {"ops": self.ops, "seconds": self.seconds, "ops_s": self.rate, "errors": self.errors,
                "first_error": self.first_error, **latency_summary(self.lat)}


_PAYLOAD = os.urandom(1 << 20)


def payload() -> bytes:
    return _PAYLOAD


def run_phase(port: int, op: str, names: list[str], size: int, conc: int, seconds: float,
              max_ops: int | None = None, cycle: bool = False, chunked: int = 0) -> Phase:
    """Run `op` (PUT/GET/HEAD/DELETE) on `names` with `conc` client threads.

    Stops after every name was used once (or, with cycle=True, after max_ops operations),
    or when `seconds` have passed.  Returns throughput and per-request latencies; a status
    outside 2xx counts as an error."""
    ph = Phase()
    total = max_ops if cycle else min(len(names), max_ops or len(names))
    counter = itertools.count()
    stop_at = [0.0]
    lock = threading.Lock()
    ok_status = {"PUT": (201,), "GET": (200,), "HEAD": (200,), "DELETE": (204,)}[op]
    body = payload() if op == "PUT" else None
    ct = {"Content-Type": "application/octet-stream"}

    def worker():
        lat = []
        errs = 0
        first = ""
        nbytes = 0
        try:
            c = Conn(port)
        except OSError as e:
            with lock:
                ph.errors += 1
                ph.first_error = ph.first_error or str(e)
            return
        try:
            while True:
                i = next(counter)
                if i >= total or time.monotonic() > stop_at[0]:
                    break
                name = names[i % len(names)]
                hdr = {"X-Timestamp": next_ts()}
                if op == "PUT":
                    hdr.update(ct)
                t0 = time.perf_counter()
                try:
                    st, got = c.request(op, obj_path(name), hdr, body=body, body_len=size if body else 0,
                                        chunked=chunked)
                except (OSError, HTTPError) as e:
                    errs += 1
                    first = first or f"{op} {name}: {e}"
                    c.close()
                    c = Conn(port)
                    continue
                dt = time.perf_counter() - t0
                if st not in ok_status:
                    errs += 1
                    first = first or f"{op} {name}: HTTP {st}"
                    continue
                lat.append(dt)
                nbytes += got if op == "GET" else (size if op == "PUT" else 0)
        finally:
            c.close()
            with lock:
                ph.lat.extend(lat)
                ph.errors += errs
                ph.bytes += nbytes
                if first and not ph.first_error:
                    ph.first_error = first

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    t0 = time.monotonic()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ph.seconds = time.monotonic() - t0
    ph.ops = len(ph.lat)
    return ph


def big_put(port: int, name: str, size: int, chunked: int = 0) -> float:
    """One large PUT (content-length or chunked pieces); returns seconds."""
    c = Conn(port)
    try:
        t0 = time.perf_counter()
        st, _ = c.request("PUT", obj_path(name), {"X-Timestamp": next_ts(), "Content-Type": "application/octet-stream"},
                          body=payload(), body_len=size, chunked=chunked)
        dt = time.perf_counter() - t0
    finally:
        c.close()
    if st != 201:
        raise HTTPError(f"large PUT {name}: HTTP {st}")
    return dt


def single(port: int, op: str, name: str) -> int:
    c = Conn(port)
    try:
        hdr = {"X-Timestamp": next_ts()}
        st, got = c.request(op, obj_path(name), hdr)
        return st
    finally:
        c.close()


def timed_get(port: int, name: str) -> tuple[float, int]:
    c = Conn(port)
    try:
        t0 = time.perf_counter()
        st, got = c.request("GET", obj_path(name), {})
        if st != 200:
            raise HTTPError(f"GET {name}: HTTP {st}")
        return time.perf_counter() - t0, got
    finally:
        c.close()


__all__ = ["ObjectServer", "Conn", "run_phase", "big_put", "object_location", "obj_path", "log"]
