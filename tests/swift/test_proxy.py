"""Through the proxy with python-swiftclient: containers, listings, SLO, replicas on packfs."""
from __future__ import annotations

import hashlib
import json

import pytest
from swift.common import direct_client
from swiftclient import ClientException

from swifthelpers import md5, rand_body


@pytest.fixture(scope="module")
def conn(cluster):
    return cluster.client()


def test_account_and_containers(conn):
    names = ["alpha", "beta", "gamma"]
    for n in names:
        conn.put_container(n, headers={"X-Container-Meta-Owner": f"owner-{n}"})
    hdrs, listing = conn.get_account()
    assert {c["name"] for c in listing} >= set(names)
    assert conn.head_container("beta")["x-container-meta-owner"] == "owner-beta"
    conn.post_container("beta", {"X-Container-Meta-Owner": "changed"})
    assert conn.head_container("beta")["x-container-meta-owner"] == "changed"

    conn.put_object("gamma", "x", b"123")
    with pytest.raises(ClientException) as e:
        conn.delete_container("gamma")
    assert e.value.http_status == 409
    conn.delete_object("gamma", "x")
    conn.delete_container("gamma")
    with pytest.raises(ClientException) as e:
        conn.head_container("gamma")
    assert e.value.http_status == 404


def test_listings(conn):
    conn.put_container("list")
    objs = {}
    for d in ("a", "b"):
        for i in range(15):
            data = rand_body(i * 100)
            name = f"{d}/{i:03d}"
            conn.put_object("list", name, data)
            objs[name] = data
    conn.put_object("list", "top", b"t")
    objs["top"] = b"t"

    hdrs, listing = conn.get_container("list", full_listing=True)
    assert [o["name"] for o in listing] == sorted(objs)
    for o in listing:
        assert o["hash"] == md5(objs[o["name"]]) and o["bytes"] == len(objs[o["name"]])
    assert int(hdrs["x-container-object-count"]) == len(objs)
    assert int(hdrs["x-container-bytes-used"]) == sum(map(len, objs.values()))

    _, listing = conn.get_container("list", prefix="b/", limit=5)
    assert [o["name"] for o in listing] == [f"b/{i:03d}" for i in range(5)]
    _, listing = conn.get_container("list", prefix="b/", marker="b/009")
    assert [o["name"] for o in listing] == [f"b/{i:03d}" for i in range(10, 15)]
    _, listing = conn.get_container("list", delimiter="/")
    assert [o.get("subdir", o.get("name")) for o in listing] == ["a/", "b/", "top"]
    _, listing = conn.get_container("list", end_marker="a/003")
    assert [o["name"] for o in listing] == ["a/000", "a/001", "a/002"]


def test_object_ops_through_proxy(cluster, conn):
    conn.put_container("objs")
    data = rand_body(300 * 1024)
    etag = conn.put_object("objs", "o", data, headers={"X-Object-Meta-Color": "blue"})
    assert etag == md5(data)
    hdrs, body = conn.get_object("objs", "o")
    assert body == data and hdrs["x-object-meta-color"] == "blue"
    conn.post_object("objs", "o", {"X-Object-Meta-Color": "red"})
    assert conn.head_object("objs", "o")["x-object-meta-color"] == "red"
    hdrs, body = conn.get_object("objs", "o", headers={"Range": "bytes=1000-1999"})
    assert body == data[1000:2000]
    # Server-side copy.
    conn.copy_object("objs", "o", "/objs/o-copy")
    assert conn.get_object("objs", "o-copy")[1] == data

    # All three replicas are on their primary devices, each with the same ETag.
    ring = cluster.ring("object")
    part, nodes = ring.get_nodes(conn.get_auth()[0].rsplit("/", 1)[1], "objs", "o")
    assert len(nodes) == 3
    for node in nodes:
        hdrs = direct_client.direct_head_object(node, part, conn.get_auth()[0].rsplit("/", 1)[1], "objs", "o")
        assert hdrs["Etag"].strip('"') == md5(data), node["device"]


def test_slo(conn):
    conn.put_container("slo")
    conn.put_container("slo_segments")
    seg_size = 1024 * 1024 + 17   # not aligned: segment boundaries fall mid-chunk
    segs, manifest = [], []
    for i in range(4):
        data = rand_body(seg_size if i < 3 else 12345)
        etag = conn.put_object("slo_segments", f"big/{i:02d}", data)
        segs.append(data)
        manifest.append({"path": f"/slo_segments/big/{i:02d}", "etag": etag, "size_bytes": len(data)})
    conn.put_object("slo", "big", json.dumps(manifest), query_string="multipart-manifest=put")
    whole = b"".join(segs)

    hdrs = conn.head_object("slo", "big")
    assert hdrs["x-static-large-object"] == "True"
    assert int(hdrs["content-length"]) == len(whole)
    hdrs, body = conn.get_object("slo", "big")
    assert hashlib.md5(body).hexdigest() == md5(whole) and body == whole
    # A range that spans a segment boundary.
    lo, hi = seg_size - 100, seg_size + 99
    _, body = conn.get_object("slo", "big", headers={"Range": f"bytes={lo}-{hi}"})
    assert body == whole[lo:hi + 1]
    # The manifest itself.
    _, raw = conn.get_object("slo", "big", query_string="multipart-manifest=get")
    assert [s["name"] for s in json.loads(raw)] == [m["path"] for m in manifest]
    # Delete the manifest and its segments.
    conn.delete_object("slo", "big", query_string="multipart-manifest=delete")
    _, listing = conn.get_container("slo_segments")
    assert listing == []
    with pytest.raises(ClientException) as e:
        conn.head_object("slo", "big")
    assert e.value.http_status == 404


def test_chunked_and_content_length_large(conn):
    conn.put_container("large")
    data = rand_body(8 * 1024 * 1024 + 3)

    class Reader:
        def __init__(self):
            self.pos = 0

        def read(self, n=-1):
            n = len(data) - self.pos if n < 0 else n
            out = data[self.pos:self.pos + n]
            self.pos += len(out)
            return out

    assert conn.put_object("large", "chunked", Reader(), chunk_size=65536) == md5(data)
    assert conn.put_object("large", "cl", Reader(), content_length=len(data), chunk_size=65536) == md5(data)
    for name in ("chunked", "cl"):
        hdrs, body = conn.get_object("large", name)
        assert body == data, name
