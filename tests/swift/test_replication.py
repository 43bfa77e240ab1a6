"""Replication (rsync and ssync) between packfs devices, and the auditor on a corrupt replica."""
from __future__ import annotations

import os
import secrets
import shutil

import pytest
from swift.common import direct_client
from swift.common.exceptions import ClientException as DirectClientException

from swiftenv import require_packfs
from swifthelpers import find_marker, flip_byte, md5, object_dir, rand_body, replicate, request


@pytest.fixture(scope="module")
def env(cluster):
    conn = cluster.client()
    account = conn.get_auth()[0].rsplit("/", 1)[1]
    ring = cluster.ring("object")
    return cluster, conn, account, ring


def direct_get(node, part, account, container, name):
    """(status, headers, body) of a GET straight to one device's object server."""
    try:
        hdrs, body = direct_client.direct_get_object(node, part, account, container, name,
                                                     resp_chunk_size=None)
        return 200, hdrs, body
    except DirectClientException as e:
        return e.http_status, {}, b""


def replicate_once(cluster, device, part, sync_method="rsync"):
    conf = None if sync_method == cluster.sync_method else cluster.object_conf_variant(sync_method=sync_method)
    r = cluster.run_once("object-replicator", f"--devices={device}", f"--partitions={part}", conf=conf)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


@pytest.mark.parametrize("sync_method", ["rsync", "ssync"])
def test_missing_replica_restored(env, sync_method):
    cluster, conn, account, ring = env
    container, name = f"repl-{sync_method}", "obj"
    data = rand_body(200 * 1024 + 7)
    conn.put_container(container)
    conn.put_object(container, name, data, headers={"X-Object-Meta-Kind": sync_method})
    part, nodes = ring.get_nodes(account, container, name)
    victim, source = nodes[0], nodes[1]

    # Lose the victim's copy of the whole partition.
    shutil.rmtree(cluster.node_root / victim["device"] / "objects" / str(part))
    assert direct_get(victim, part, account, container, name)[0] == 404

    out = replicate_once(cluster, source["device"], part, sync_method)
    if sync_method == "rsync":
        assert "1 successes" in out or "successes" in out, out[-2000:]

    status, hdrs, body = direct_get(victim, part, account, container, name)
    assert status == 200, out[-3000:]
    assert body == data
    assert hdrs["X-Object-Meta-Kind"] == sync_method
    assert hdrs["Etag"].strip('"') == md5(data)
    # The restored replica is a proper Swift object: one .data with its metadata xattrs.
    d = object_dir(cluster.node_root, victim["device"], part, account, container, name)
    files = os.listdir(d)
    assert len(files) == 1 and files[0].endswith(".data"), files
    assert "user.swift.metadata" in os.listxattr(d / files[0])
    # And the suffix hashes now agree between source and victim.
    port = cluster.ports["object"]
    src_hashes = replicate(port, source["device"], part)
    dst_hashes = replicate(port, victim["device"], part)
    assert src_hashes[d.parent.name] == dst_hashes[d.parent.name]
    assert request(port, "HEAD", f"/{victim['device']}/{part}/{account}/{container}/{name}").status == 200


def put_marked(conn, container, name):
    """An object whose body carries a unique 64-byte marker, to find it in a pack file."""
    marker = (b"PACKFS-MARKER-" + secrets.token_hex(25).encode())[:64]
    assert len(marker) == 64
    data = rand_body(4000) + marker + rand_body(4000)
    conn.put_container(container)
    conn.put_object(container, name, data)
    return data, marker


def corrupt_replica(cluster, device: str, marker: bytes, data_dir) -> str:
    """Flip one byte in the middle of ``marker`` in one device's copy.

    packfs: unmount the device, flip the byte inside the file's record in
    ``PACKDIR/volumes/*.pack`` (its CRC then fails: reads return EIO), mount again.
    dir: flip it in the .data file itself (only the MD5 check can notice).
    """
    if cluster.backend == "dir":
        (data_file,) = [data_dir / f for f in os.listdir(data_dir) if f.endswith(".data")]
        off = data_file.read_bytes().find(marker)
        assert off >= 0
        flip_byte(data_file, off + 32)
        return str(data_file)
    dev = cluster.device(device)
    cluster.umount_device(dev)
    try:
        hits = find_marker(dev.packdir, marker)
        assert len(hits) == 1, f"marker found {len(hits)} times in {dev.packdir}/volumes: {hits}"
        vol, off = hits[0]
        flip_byte(vol, off + 32)
    finally:
        cluster.mount_device(dev)
    return f"{vol}@{off + 32}"


def test_auditor_quarantines_and_replicator_restores(env):
    cluster, conn, account, ring = env
    container, name = "audit", "victim"
    data, marker = put_marked(conn, container, name)
    part, nodes = ring.get_nodes(account, container, name)
    victim, source = nodes[0], nodes[1]
    d = object_dir(cluster.node_root, victim["device"], part, account, container, name)
    where = corrupt_replica(cluster, victim["device"], marker, d)

    r = cluster.run_once("object-auditor", f"--devices={victim['device']}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "failed audit and was quarantined" in out, f"corrupted {where}; auditor said:\n{out[-3000:]}"
    qdir = cluster.node_root / victim["device"] / "quarantined" / "objects" / d.name
    assert qdir.is_dir() and any(f.endswith(".data") for f in os.listdir(qdir))
    assert direct_get(victim, part, account, container, name)[0] == 404

    # The proxy never returns wrong bytes: the good replicas answer.
    for _ in range(6):
        hdrs, body = conn.get_object(container, name)
        assert body == data

    replicate_once(cluster, source["device"], part)
    status, hdrs, body = direct_get(victim, part, account, container, name)
    assert status == 200 and body == data


def test_corrupt_replica_never_served(env):
    """A GET that lands on the corrupt replica fails (EIO → quarantine), never returns
    wrong bytes; through the proxy the object reads back right every time."""
    require_packfs()
    cluster, conn, account, ring = env
    container, name = "audit", "served"
    data, marker = put_marked(conn, container, name)
    part, nodes = ring.get_nodes(account, container, name)
    victim = nodes[0]
    d = object_dir(cluster.node_root, victim["device"], part, account, container, name)
    where = corrupt_replica(cluster, victim["device"], marker, d)

    # Straight to the corrupt replica: an error status or a short body, not wrong bytes.
    path = f"/{victim['device']}/{part}/{account}/{container}/{name}"
    r = request(cluster.ports["object"], "GET", path)
    assert not (r.status == 200 and r.complete and r.body != data), f"wrong bytes served from {where}"
    assert not (r.status == 200 and r.complete), f"corrupt replica ({where}) read back whole: {r.status}"
    print(f"direct GET of the corrupt replica ({where}): {r.status}, {len(r.body)} of {len(data)} bytes, complete={r.complete}")
    # The object server quarantined it when the read failed with EIO.
    qdir = cluster.node_root / victim["device"] / "quarantined" / "objects" / d.name
    assert qdir.is_dir(), os.listdir(cluster.node_root / victim["device"])

    for _ in range(6):
        hdrs, body = conn.get_object(container, name)
        assert body == data
