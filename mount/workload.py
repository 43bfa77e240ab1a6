"""The demo's workload through a Swift proxy, with python-swiftclient, every byte verified.

Shared by the single-node demo (mount/demo.py), the multi-node one
(mount/multinode_demo.py) and their tests: deterministic bodies (a seed and a size,
so large ones are never held whole), a Phase timer that prints progress, the
workload itself (small objects, a chunked and a content-length large object, an
SLO, optionally erasure-coded objects, a listing, deletes) and a verifier that
reads any set of objects back through the proxy.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import random
import time
from typing import Callable, Iterator

CHUNK = 64 * 1024


def body(seed: int | str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def stream(seed: int, size: int) -> Iterator[bytes]:
    """A deterministic body generated in 64 KiB pieces (never held whole)."""
    rnd = random.Random(seed)
    left = size
    while left:
        n = min(CHUNK, left)
        yield rnd.randbytes(n)
        left -= n


def md5_of(chunks: Iterator[bytes]) -> tuple[str, int]:
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
    """Prints a step as it starts and its time when it ends, and logs (name, seconds)."""

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


Key = tuple[str, str]  # (container, object name)


@dataclasses.dataclass
class Stored:
    """What a workload left in the cluster, as a client sees it."""
    objects: dict[Key, tuple[str, int]]  # (md5, size) of what a GET through the proxy returns
    manifests: set[Key]   # SLO manifests: on a device their bytes are the manifest, not the object
    deleted: int
    ec_objects: int
    verified_bytes: int

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.objects.values())


def verify_objects(connect: Callable, objects: dict[Key, tuple[str, int]], threads: int) -> int:
    """GET every object through the proxy, ``threads`` at a time, and compare every byte
    (by MD5 and length) with what was stored; returns the bytes verified."""
    def get_verify(key: Key) -> int:
        md5, n = objects[key]
        hdrs, chunks = connect().get_object(*key, resp_chunk_size=CHUNK)
        got_md5, got_n = md5_of(chunks)
        assert (got_md5, got_n) == (md5, n), f"{'/'.join(key)}: got {got_n} bytes md5 {got_md5}, want {n} {md5}"
        return n

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(get_verify, sorted(objects)))


def workload(connect: Callable, n_small: int, large_mib: int, slo_segments: int, seg_mib: int,
             threads: int, phases: list, ec: bool = True) -> Stored:
    """``connect()`` gives a swiftclient Connection to the proxy."""
    from swiftclient import ClientException
    stored: dict[Key, tuple[str, int]] = {}
    conn = connect()
    with Phase(phases, "create containers"):
        conn.put_container("demo")
        conn.put_container("demo_segments")

    sizes = [0, 1, 4096, 65536, 100 * 1024] + [random.Random(i).randint(1, 32 * 1024) for i in range(n_small)]
    sizes = sizes[:max(n_small, 5)]

    def put_small(i: int) -> tuple[str, str, int]:
        data = body(i, sizes[i])
        name = f"small/{i:05d}"
        etag = connect().put_object("demo", name, data, content_type="application/octet-stream")
        assert etag == hashlib.md5(data).hexdigest(), (name, etag)
        return name, etag, len(data)

    with Phase(phases, f"PUT {len(sizes)} small objects ({threads} threads)"):
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            for name, etag, n in ex.map(put_small, range(len(sizes))):
                stored["demo", name] = (etag, n)

    large = large_mib * 1024 * 1024
    with Phase(phases, f"PUT {large_mib} MiB chunked (64 KiB pieces)"):
        etag = conn.put_object("demo", "large-chunked", contents=StreamFile(1001, large), chunk_size=CHUNK)
        stored["demo", "large-chunked"] = md5_of(stream(1001, large))
        assert etag == stored["demo", "large-chunked"][0]
    with Phase(phases, f"PUT {large_mib} MiB with Content-Length"):
        etag = conn.put_object("demo", "large-content-length", contents=StreamFile(1002, large),
                               content_length=large, chunk_size=CHUNK)
        stored["demo", "large-content-length"] = md5_of(stream(1002, large))
        assert etag == stored["demo", "large-content-length"][0]

    seg = seg_mib * 1024 * 1024
    with Phase(phases, f"PUT SLO of {slo_segments} x {seg_mib} MiB segments"):
        manifest, whole = [], hashlib.md5()
        for s in range(slo_segments):
            data = body(2000 + s, seg)
            etag = conn.put_object("demo_segments", f"big-slo/{s:03d}", data)
            manifest.append({"path": f"/demo_segments/big-slo/{s:03d}", "etag": etag, "size_bytes": seg})
            stored["demo_segments", f"big-slo/{s:03d}"] = (etag, seg)
            whole.update(data)
        conn.put_object("demo", "big-slo", json.dumps(manifest), query_string="multipart-manifest=put")
        stored["demo", "big-slo"] = (whole.hexdigest(), seg * slo_segments)

    ec_sizes = [0, 4096, 300 * 1024, 3 * 1024 * 1024 + 5] if ec else []
    if ec:
        with Phase(phases, f"erasure-coded policy: PUT and GET {len(ec_sizes)} objects (2 data + 1 parity fragments)"):
            conn.put_container("demo_ec", headers={"X-Storage-Policy": "ec"})
            for i, size in enumerate(ec_sizes):
                data = body(3000 + i, size)
                etag = conn.put_object("demo_ec", f"ec/{i}", data)
                assert etag == hashlib.md5(data).hexdigest(), (i, etag)
                assert conn.get_object("demo_ec", f"ec/{i}")[1] == data, f"ec/{i} read back wrong"

    with Phase(phases, f"GET and verify every byte of {len(stored)} objects"):
        verified = verify_objects(connect, stored, threads)

    in_demo = {name: v for (container, name), v in stored.items() if container == "demo"}
    with Phase(phases, "list container"):
        _, listing = conn.get_container("demo", full_listing=True)
        listed = {o["name"]: (o["hash"], o["bytes"]) for o in listing}
        assert set(listed) == set(in_demo), set(listed) ^ set(in_demo)
        for name, (md5, n) in in_demo.items():
            if name != "big-slo":
                assert listed[name] == (md5, n), (name, listed[name], (md5, n))

    deleted = [n for n in sorted(in_demo)[::3] if n.startswith("small/")]
    with Phase(phases, f"DELETE {len(deleted)} objects"):
        for name in deleted:
            conn.delete_object("demo", name)
        for name in deleted:
            try:
                conn.head_object("demo", name)
                raise AssertionError(f"{name} still there after DELETE")
            except ClientException as e:
                assert e.http_status == 404, e
            del stored["demo", name]
        _, listing = conn.get_container("demo", full_listing=True)
        assert {o["name"] for o in listing} == {n for c, n in stored if c == "demo"}
    return Stored(stored, {("demo", "big-slo")}, len(deleted), len(ec_sizes), verified)


