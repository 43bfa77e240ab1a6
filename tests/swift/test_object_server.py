"""Stock Swift's object server HTTP API, directly, on a packfs device."""
from __future__ import annotations

import os
import pickle

import pytest

from mounts import stats
from swifthelpers import md5, obj_path, object_dir, rand_body, replicate, request, ts

ACCOUNT, CONTAINER = "AUTH_test", "c"
SIZES = {"0B": 0, "4KiB": 4096, "100KiB": 100 * 1024, "5MiB": 5 * 1024 * 1024}
DEV = "sdb1"


@pytest.fixture(scope="module")
def osrv(cluster):
    ring = cluster.ring("object")

    class O:
        port = cluster.ports["object"]
        root = cluster.node_root
        backend = cluster.backend

        @staticmethod
        def part(name: str) -> int:
            return ring.get_part(ACCOUNT, CONTAINER, name)

        @classmethod
        def path(cls, name: str, dev: str = DEV) -> str:
            return obj_path(dev, cls.part(name), ACCOUNT, CONTAINER, name)

        @classmethod
        def put(cls, name: str, data: bytes, chunked: bool = False, headers: dict | None = None,
                timestamp: str | None = None):
            hdrs = {"X-Timestamp": timestamp or ts(), "Content-Type": "application/octet-stream",
                    **(headers or {})}
            return request(cls.port, "PUT", cls.path(name), hdrs, data, chunked=chunked)

        @classmethod
        def call(cls, method: str, name: str, headers: dict | None = None):
            return request(cls.port, method, cls.path(name), headers)

        @classmethod
        def files(cls, name: str) -> list[str]:
            d = object_dir(cls.root, DEV, cls.part(name), ACCOUNT, CONTAINER, name)
            return sorted(os.listdir(d)) if d.exists() else []

    return O


@pytest.mark.parametrize("mode", ["content-length", "chunked"])
@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_put_get_head_delete(osrv, size, mode):
    name = f"o-{size}-{mode}"
    data = rand_body(size)
    r = osrv.put(name, data, chunked=(mode == "chunked"))
    assert r.status == 201, r
    assert r.etag == md5(data)

    r = osrv.call("GET", name)
    assert r.status == 200 and r.complete
    assert r.etag == md5(data) and int(r.h("content-length")) == size
    assert r.body == data

    r = osrv.call("HEAD", name)
    assert r.status == 200 and int(r.h("content-length")) == size and r.etag == md5(data)
    files = osrv.files(name)
    assert len(files) == 1 and files[0].endswith(".data"), files
    xattrs = os.listxattr(object_dir(osrv.root, DEV, osrv.part(name), ACCOUNT, CONTAINER, name) / files[0])
    assert "user.swift.metadata" in xattrs

    r = osrv.call("DELETE", name, {"X-Timestamp": ts()})
    assert r.status == 204, r
    r = osrv.call("GET", name)
    assert r.status == 404 and r.h("x-backend-timestamp")
    files = osrv.files(name)
    assert len(files) == 1 and files[0].endswith(".ts"), files


def test_put_with_etag_checked(osrv):
    data = rand_body(4096)
    assert osrv.put("etag-ok", data, headers={"ETag": md5(data)}).status == 201
    r = osrv.put("etag-bad", data, headers={"ETag": md5(b"other")})
    assert r.status == 422, r
    assert osrv.call("GET", "etag-bad").status == 404


def test_metadata_round_trip_via_post(osrv):
    data = rand_body(4096)
    # Metadata bigger than one 64 KiB xattr (swift.conf raises the constraints). Request
    # headers are limited to 64 KiB in all, but Swift UTF-8-encodes the WSGI (latin-1)
    # strings when it pickles them, so non-ASCII values double in size on disk.
    value = ("é" * 1000).encode()             # 2000 bytes on the wire, 4000 pickled
    meta = {f"X-Object-Meta-K{i}": value + str(i).encode() for i in range(24)}
    r = osrv.put("meta", data, headers={**meta, "Content-Type": "text/x-packfs"})
    if r.status == 507 and osrv.backend == "dir":
        pytest.skip("the plain-directory backend's filesystem (ext4) cannot hold Swift's large xattrs")
    assert r.status == 201, r
    r = osrv.call("HEAD", "meta")
    assert r.status == 200 and r.h("content-type") == "text/x-packfs"
    for k, v in meta.items():
        assert r.h(k) == v.decode("latin-1")
    # Swift splits the pickled metadata into 64 KiB xattrs: user.swift.metadata, ...1
    d = object_dir(osrv.root, DEV, osrv.part("meta"), ACCOUNT, CONTAINER, "meta")
    data_file = d / osrv.files("meta")[0]
    keys = [x for x in os.listxattr(data_file) if x.startswith("user.swift.metadata")]
    assert {"user.swift.metadata", "user.swift.metadata1"} <= set(keys), keys
    assert len(os.getxattr(data_file, "user.swift.metadata")) == 65536

    # POST replaces the user metadata (a .meta file beside the .data).
    r = osrv.call("POST", "meta", {"X-Timestamp": ts(), "X-Object-Meta-New": "after post",
                                   "Content-Type": "text/after"})
    assert r.status == 202, r
    r = osrv.call("HEAD", "meta")
    assert r.h("x-object-meta-new") == "after post"
    assert r.h("x-object-meta-k0") is None
    assert r.h("content-type") == "text/after"
    assert r.etag == md5(data)
    assert any(f.endswith(".meta") for f in osrv.files("meta")), osrv.files("meta")
    r = osrv.call("GET", "meta")
    assert r.body == data and r.h("x-object-meta-new") == "after post"


def test_range_gets(osrv):
    data = rand_body(100 * 1024)
    assert osrv.put("ranges", data).status == 201
    for rng, want in [("bytes=0-9", data[:10]), ("bytes=-100", data[-100:]),
                      ("bytes=100000-", data[100000:]), ("bytes=65530-65545", data[65530:65546])]:
        r = osrv.call("GET", "ranges", {"Range": rng})
        assert r.status == 206, (rng, r.status)
        assert r.body == want, rng
    r = osrv.call("GET", "ranges", {"Range": "bytes=0-1,70000-70009"})
    assert r.status == 206 and r.h("content-type").startswith("multipart/byteranges")
    assert data[:2] in r.body and data[70000:70010] in r.body
    r = osrv.call("GET", "ranges", {"Range": f"bytes={len(data) + 10}-"})
    assert r.status == 416


def test_objects_are_written_with_no_name_and_linked_into_place(osrv):
    """Swift's object writer opens the hash directory with O_TMPFILE and names the file
    with linkat once it is whole (DiskFileManager.use_linkat): on packfs too, so no
    temporary name ever shows in <device>/tmp, and every object reads back."""
    if osrv.backend != "packfs":
        pytest.skip("counts packfs's O_TMPFILE opens")
    device = osrv.root / DEV
    before = stats(device)["tmpfiles"]
    bodies = {f"linkat-{i}": rand_body(3000 * i) for i in range(1, 6)}
    for name, body in bodies.items():
        assert osrv.put(name, body).status == 201
    assert stats(device)["tmpfiles"] >= before + len(bodies)
    assert not (device / "tmp").exists() or os.listdir(device / "tmp") == []
    for name, body in bodies.items():
        r = osrv.call("GET", name)
        assert r.status == 200 and r.body == body


def test_overwrite_and_tombstones(osrv):
    v1, v2 = rand_body(5000), rand_body(7000)
    t1 = ts()
    assert osrv.put("ow", v1, timestamp=t1).status == 201
    t2 = ts()
    assert osrv.put("ow", v2, timestamp=t2).status == 201
    r = osrv.call("GET", "ow")
    assert r.body == v2 and r.h("x-timestamp")
    files = osrv.files("ow")
    assert [f for f in files if f.endswith(".data")] == [f"{t2}.data"], files   # old .data cleaned up
    # An older PUT loses: 409.
    assert osrv.put("ow", v1, timestamp=t1).status == 409
    # Tombstone, then an older PUT is refused and a newer one wins.
    t3 = ts()
    assert osrv.call("DELETE", "ow", {"X-Timestamp": t3}).status == 204
    assert osrv.files("ow") == [f"{t3}.ts"]
    assert osrv.put("ow", v1, timestamp=t2).status == 409
    assert osrv.call("GET", "ow").status == 404
    t4 = ts()
    assert osrv.put("ow", v1, timestamp=t4).status == 201
    assert osrv.call("GET", "ow").body == v1
    assert osrv.files("ow") == [f"{t4}.data"]
    # DELETE of something never written: 404, but a tombstone is still laid down.
    assert osrv.call("DELETE", "never-written", {"X-Timestamp": ts()}).status == 404
    assert osrv.files("never-written")[0].endswith(".ts")


def test_replicate_suffix_hashes(osrv):
    name = "repl-obj"
    part = osrv.part(name)
    d = object_dir(osrv.root, DEV, part, ACCOUNT, CONTAINER, name)
    suffix = d.parent.name
    assert osrv.put(name, rand_body(1000)).status == 201
    hashes = replicate(osrv.port, DEV, part)
    assert suffix in hashes and hashes[suffix], hashes
    first = hashes[suffix]
    # Asking again without changes gives the same answer (from hashes.pkl).
    assert replicate(osrv.port, DEV, part)[suffix] == first
    assert (osrv.root / DEV / "objects" / str(part) / "hashes.pkl").exists()
    # A newer version invalidates the suffix (hashes.invalid) and changes its hash.
    assert osrv.put(name, rand_body(1000)).status == 201
    # REPLICATE with suffixes (as the replicator sends after a sync) only invalidates them.
    assert replicate(osrv.port, DEV, part, [suffix]) is None
    second = replicate(osrv.port, DEV, part)[suffix]
    assert second and second != first
    # A tombstone changes it again; the hash covers .ts files too.
    assert osrv.call("DELETE", name, {"X-Timestamp": ts()}).status == 204
    third = replicate(osrv.port, DEV, part)[suffix]
    assert third not in (first, second)
    # The partition lock file Swift flocks lives in the mount.
    assert (osrv.root / DEV / "objects" / str(part) / ".lock").exists()
    # An unknown partition: empty dict.
    assert replicate(osrv.port, DEV, 999999) == {}


def test_many_objects_one_partition_listing(osrv):
    """Listdir-heavy paths: many hash dirs in one partition, all readable."""
    names = [f"many-{i}" for i in range(60)]
    bodies = {n: rand_body(i * 37) for i, n in enumerate(names)}
    for n in names:
        assert osrv.put(n, bodies[n]).status == 201
    for n in names:
        r = osrv.call("GET", n)
        assert r.status == 200 and r.body == bodies[n]
    parts = {osrv.part(n) for n in names}
    for p in parts:
        assert isinstance(pickle.loads(request(osrv.port, "REPLICATE", f"/{DEV}/{p}").body), dict)
