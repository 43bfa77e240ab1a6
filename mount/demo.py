#!/usr/bin/env python3
"""make demo: stock OpenStack Swift on four packfs devices, end to end.

    demo.py [--run-dir run/demo] [--node-root DIR] [--keep] [--backend packfs|dir]
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
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swiftcluster import REPO, SwiftCluster, mounts, port_is_free  # noqa: E402

CHUNK = 64 * 1024


def body(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def stream(seed: int, size: int):
    """A deterministic body generated in 64 KiB pieces (never held whole)."""
    rnd = random.Random(seed)
    left = size
    while left:
        n = min(CHUNK, left)
        yield rnd.randbytes(n)
        left -= n


def md5_of(chunks) -> tuple[str, int]:
    h, n = hashlib.md5(), 0
    for c in chunks:
        h.update(c)
        n += len(c)
    return h.hexdigest(), n


class StreamFile:
    """A read-only, unseekable body generated on the fly, read in whatever pieces the
    client asks (swiftclient asks for chunk_size bytes; without a content length it
    sends each piece as one HTTP chunk)."""

    def __init__(self, seed: int, size: int):
        self._gen, self._buf, self.size = stream(seed, size), b"", size

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) < n):
            try:
                self._buf += next(self._gen)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


class Phase:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def __enter__(self):
        print(f"== {self.name} ...", flush=True)
        self.t = time.monotonic()
        return self

    def __exit__(self, *exc):
        dt = time.monotonic() - self.t
        self.log.append((self.name, dt))
        print(f"   {self.name}: {dt:.1f}s{'  FAILED' if exc[0] else ''}", flush=True)


def workload(c: SwiftCluster, n_small: int, large_mib: int, slo_segments: int, seg_mib: int,
             threads: int, phases: list) -> dict:
    from swiftclient import ClientException
    stored: dict[str, tuple[str, int]] = {}  # name -> (md5, size)
    conn = c.client()
    with Phase(phases, "create containers"):
        conn.put_container("demo")
        conn.put_container("demo_segments")

    sizes = [0, 1, 4096, 65536, 100 * 1024] + [random.Random(i).randint(1, 32 * 1024) for i in range(n_small)]
    sizes = sizes[:max(n_small, 5)]

    def put_small(i: int) -> tuple[str, str, int]:
        data = body(i, sizes[i])
        name = f"small/{i:05d}"
        etag = c.client().put_object("demo", name, data, content_type="application/octet-stream")
        assert etag == hashlib.md5(data).hexdigest(), (name, etag)
        return name, etag, len(data)

    with Phase(phases, f"PUT {len(sizes)} small objects ({threads} threads)"):
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            for name, etag, n in ex.map(put_small, range(len(sizes))):
                stored[name] = (etag, n)

    large = large_mib * 1024 * 1024
    with Phase(phases, f"PUT {large_mib} MiB chunked (64 KiB pieces)"):
        etag = conn.put_object("demo", "large-chunked", contents=StreamFile(1001, large), chunk_size=CHUNK)
        stored["large-chunked"] = md5_of(stream(1001, large))
        assert etag == stored["large-chunked"][0]
    with Phase(phases, f"PUT {large_mib} MiB with Content-Length"):
        etag = conn.put_object("demo", "large-content-length", contents=StreamFile(1002, large),
                               content_length=large, chunk_size=CHUNK)
        stored["large-content-length"] = md5_of(stream(1002, large))
        assert etag == stored["large-content-length"][0]

    seg = seg_mib * 1024 * 1024
    with Phase(phases, f"PUT SLO of {slo_segments} x {seg_mib} MiB segments"):
        manifest, whole = [], hashlib.md5()
        for s in range(slo_segments):
            data = body(2000 + s, seg)
            etag = conn.put_object("demo_segments", f"big-slo/{s:03d}", data)
            manifest.append({"path": f"/demo_segments/big-slo/{s:03d}", "etag": etag, "size_bytes": seg})
            whole.update(data)
        conn.put_object("demo", "big-slo", json.dumps(manifest), query_string="multipart-manifest=put")
        stored["big-slo"] = (whole.hexdigest(), seg * slo_segments)

    ec_sizes = [0, 4096, 300 * 1024, 3 * 1024 * 1024 + 5]
    with Phase(phases, f"erasure-coded policy: PUT and GET {len(ec_sizes)} objects (2 data + 1 parity fragments)"):
        conn.put_container("demo_ec", headers={"X-Storage-Policy": "ec"})
        for i, size in enumerate(ec_sizes):
            data = body(3000 + i, size)
            etag = conn.put_object("demo_ec", f"ec/{i}", data)
            assert etag == hashlib.md5(data).hexdigest(), (i, etag)
            assert conn.get_object("demo_ec", f"ec/{i}")[1] == data, f"ec/{i} read back wrong"

    def get_verify(name: str) -> int:
        md5, n = stored[name]
        hdrs, chunks = c.client().get_object("demo", name, resp_chunk_size=CHUNK)
        got_md5, got_n = md5_of(chunks)
        assert (got_md5, got_n) == (md5, n), f"{name}: got {got_n} bytes md5 {got_md5}, want {n} {md5}"
        return n

    with Phase(phases, f"GET and verify every byte of {len(stored)} objects"):
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            verified = sum(ex.map(get_verify, sorted(stored)))

    with Phase(phases, "list container"):
        _, listing = conn.get_container("demo", full_listing=True)
        listed = {o["name"]: (o["hash"], o["bytes"]) for o in listing}
        assert set(listed) == set(stored), set(listed) ^ set(stored)
        for name, (md5, n) in stored.items():
            if name != "big-slo":
                assert listed[name] == (md5, n), (name, listed[name], (md5, n))

    deleted = sorted(stored)[::3]
    deleted = [n for n in deleted if n.startswith("small/")]
    with Phase(phases, f"DELETE {len(deleted)} objects"):
        for name in deleted:
            conn.delete_object("demo", name)
        for name in deleted:
            try:
                conn.head_object("demo", name)
                raise AssertionError(f"{name} still there after DELETE")
            except ClientException as e:
                assert e.http_status == 404, e
            del stored[name]
        _, listing = conn.get_container("demo", full_listing=True)
        assert {o["name"] for o in listing} == set(stored)
    return {"objects": len(stored), "ec_objects": len(ec_sizes), "bytes": sum(n for _, n in stored.values()),
            "verified_bytes": verified, "deleted": len(deleted), "stored": stored}


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
    if not (run_dir / "cluster.json").exists():
        print(f"nothing recorded in {run_dir}/cluster.json: nothing to stop")
        return 0
    c = SwiftCluster.load(run_dir)
    errors = c.teardown()
    print(f"stopped the cluster in {run_dir}" + (f"; errors: {errors}" if errors else ""))
    return 1 if errors else 0


RUN_PARTS = ("packs", "etc", "log", "cache", "pid", "tmp", "srv", "cluster.json")  # what a cluster makes there


def remove_run_dir(run_dir: Path) -> None:
    """A passed demo leaves nothing behind (its packs are ~400 MB); a failed one keeps all
    to be looked at, and KEEP=1 the running cluster. Only what the cluster made goes (RUN_DIR
    may be any directory), and never through a mount."""
    with open("/proc/mounts") as f:
        under = [t for t in (line.split()[1] for line in f) if t.startswith(f"{run_dir}/")]
    if under:
        print(f"left {run_dir} in place: {', '.join(under)} still mounted")
        return
    for part in RUN_PARTS:
        path = run_dir / part
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # if the demo's parts were all it held
    print(f"removed the demo's packs and logs from {run_dir} (make demo KEEP=1 keeps them)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default=str(REPO / "run" / "demo"))
    ap.add_argument("--node-root", default=None, help="mount the devices here (e.g. /srv/node)")
    ap.add_argument("--backend", default=None, choices=["packfs", "dir"])
    ap.add_argument("--mount-options", default=os.environ.get("PACKFS_OPTIONS", "noatime"),
                    help="-o options of every packfs device (default noatime, as Swift devices are mounted)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--stop", action="store_true", help="tear down a kept cluster")
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--large-mib", type=int, default=16)
    ap.add_argument("--slo-segments", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    run_dir = Path(args.run_dir).absolute()
    if args.stop:
        return stop(run_dir)

    if (run_dir / "cluster.json").exists():
        print(f"tearing down what a previous run left in {run_dir}")
        stop(run_dir)
    for sub in ("packs", "etc", "log", "cache", "pid", "tmp"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    node_root = Path(args.node_root) if args.node_root else None
    proxy_port = 8080 if port_is_free(8080) else None
    c = SwiftCluster(run_dir, node_root, backend=args.backend, mount_options=args.mount_options,
                     proxy_port=proxy_port)
    if c.backend == "dir":
        c.clean_node_root()
    for d in c.devices:
        if c.backend == "packfs" and mounts.is_mounted(d.mountpoint):
            raise SystemExit(f"{d.mountpoint} is mounted already; unmount it first")
    phases: list[tuple[str, float]] = []
    t0 = time.monotonic()
    ok = False
    try:
        with Phase(phases, f"mount {len(c.devices)} {c.backend} devices, build rings, start Swift"):
            c.setup()
        print(f"   proxy {c.proxy_url}, devices under {c.node_root}, logs in {c.log_dir}")
        result = workload(c, args.small, args.large_mib, args.slo_segments, 1, args.threads, phases)
        daemons = run_daemons(c, phases)
        ok = True
    finally:
        total = time.monotonic() - t0
        if ok:
            print("\n================ summary ================")
            print(f"backend: {c.backend}; devices: {', '.join(str(d.mountpoint) for d in c.devices)}")
            print(f"stored: {result['objects']} objects, {result['bytes'] / 2**20:.1f} MiB "
                  f"(x3 replicas), verified {result['verified_bytes'] / 2**20:.1f} MiB byte for byte, "
                  f"deleted {result['deleted']}; {result['ec_objects']} erasure-coded objects")
            for name, rc, _ in daemons:
                print(f"{name} once: rc={rc}")
            print("time per phase:")
            for name, dt in phases:
                print(f"  {dt:7.1f}s  {name}")
            print(f"  {total:7.1f}s  total")
            for d in c.devices:
                stats = c.stats(d)
                lines = stats.splitlines()
                head = lines[:next((i for i, ln in enumerate(lines) if ln.startswith("operation")), len(lines))]
                ops = [ln for ln in lines if ln.split()[:1] in (["operation"], ["fsync"], ["fsyncdir"],
                                                               ["write"], ["read"], ["disk_flush"])]
                if args.keep:
                    full = c.log_dir / f"packfs-stats-{d.name}.txt"
                    full.write_text(stats + "\n")
                    print(f"--- packfs stats {d.mountpoint}   (all operations: {full})")
                else:
                    print(f"--- packfs stats {d.mountpoint}   (all operations: make demo KEEP=1 keeps them)")
                print("\n".join(ln for ln in head + ops if ln.strip()))
        if ok and args.keep:
            print(f"\nThe cluster keeps running (proxy {c.proxy_url}). Reach it with:\n"
                  f"  export ST_AUTH={c.auth_url} ST_USER=test:tester ST_KEY=testing\n"
                  f"  {REPO / '.venv/bin/swift'} stat; {REPO / '.venv/bin/swift'} list demo\n"
                  f"Stop it with: make stop" + ("" if run_dir == REPO / "run" / "demo" else f" RUN_DIR={run_dir}"))
        else:
            with Phase(phases, "stop Swift (by PID) and unmount"):
                errors = c.teardown()
            if errors:
                print("unmount errors:", errors)
                return 1
            if ok:
                remove_run_dir(run_dir)
    print("demo OK" if ok else f"demo FAILED; its packs and logs are in {run_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
