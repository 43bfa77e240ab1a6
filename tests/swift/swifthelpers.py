"""Small HTTP helpers for talking to Swift's backend servers directly."""
from __future__ import annotations

import hashlib
import http.client
import os
import pickle
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from swift.common.utils import Timestamp, hash_path


@dataclass
class Resp:
    status: int
    headers: dict
    body: bytes
    complete: bool = True   # False: the server closed before Content-Length bytes arrived

    def h(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def etag(self) -> str | None:
        e = self.h("etag")
        return e.strip('"') if e else e


def ts() -> str:
    return Timestamp(time.time()).internal


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def rand_body(size: int, seed: int | None = None) -> bytes:
    return random.Random(seed).randbytes(size) if seed is not None else os.urandom(size)


def chunks_of(data: bytes, n: int = 65536) -> Iterable[bytes]:
    for i in range(0, len(data), n):
        yield data[i:i + n]


def request(port: int, method: str, path: str, headers: dict | None = None,
            body: bytes | Iterable[bytes] | None = None, chunked: bool = False,
            timeout: float = 60) -> Resp:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = dict(headers or {})
        if chunked and body is not None:
            if isinstance(body, (bytes, bytearray)):
                body = chunks_of(bytes(body))
            conn.request(method, path, body=body, headers=headers, encode_chunked=True)
        else:
            if body is not None:
                headers.setdefault("Content-Length", str(len(body)))
            conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        complete = True
        try:
            data = r.read()
        except http.client.IncompleteRead as e:
            data, complete = e.partial, False
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data, complete)
    finally:
        conn.close()


def obj_path(device: str, part: int, account: str, container: str, obj: str) -> str:
    return f"/{device}/{part}/{account}/{container}/{obj}"


def replicate(port: int, device: str, part: int, suffixes: Iterable[str] = ()) -> dict | None:
    """The REPLICATE verb: suffix hashes of one partition; with ``suffixes`` it only
    invalidates those (and answers None), as the replicator does after a sync."""
    path = f"/{device}/{part}" + ("/" + "-".join(suffixes) if suffixes else "")
    r = request(port, "REPLICATE", path)
    assert r.status == 200, (r.status, r.body[:300])
    return pickle.loads(r.body)


def object_dir(devices_root: Path, device: str, part: int, account: str, container: str, obj: str) -> Path:
    h = hash_path(account, container, obj)
    return devices_root / device / "objects" / str(part) / h[-3:] / h


def find_marker(packdir: Path, marker: bytes) -> list[tuple[Path, int]]:
    """Where ``marker`` occurs in a packfs pack directory's volume files."""
    hits = []
    for vol in sorted((packdir / "volumes").glob("*.pack")):
        data = vol.read_bytes()
        i = data.find(marker)
        while i >= 0:
            hits.append((vol, i))
            i = data.find(marker, i + 1)
    return hits


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


DURABLE = re.compile(r"^(\d{10}\.\d{5})#(\d+)#d\.data$")  # an EC fragment archive, durable


def fragment_dirs(cluster, ring, account: str, container: str, name: str) -> list[tuple[dict, Path]]:
    """(node, hash directory) on each device the object-1 ring (the erasure-coded policy's)
    gives an object."""
    part, nodes = ring.get_nodes(account, container, name)
    h = hash_path(account, container, name)
    return [(node, cluster.node_root / node["device"] / "objects-1" / str(part) / h[-3:] / h)
            for node in nodes]


def durable_fragment(hash_dir: Path) -> tuple[str, int, bytes]:
    """(timestamp, fragment index, archive bytes) of the one durable fragment in a hash directory."""
    files = os.listdir(hash_dir)
    assert len(files) == 1, files
    m = DURABLE.match(files[0])
    assert m, files
    with open(hash_dir / files[0], "rb") as f:
        return m[1], int(m[2]), f.read()
