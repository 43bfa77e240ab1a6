"""An operator doubles the object ring's partitions with Swift's relinker, on packfs.

The steps of Swift's "modify part power" procedure, each followed by checks:
prepare_increase_partition_power (object servers then link every new PUT into its
next partition too), `swift-object-relinker relink` (a hard link of every file in its
new partition), increase_partition_power, `swift-object-relinker cleanup` (the old
names go), finish_increase_partition_power. Hard links, their link counts and
directories emptied in bulk, through a real mount and a remount.
"""
from __future__ import annotations

import os

import pytest
from swift.common.utils import hash_path

from swifthelpers import md5, rand_body


@pytest.fixture(scope="module")
def env(cluster):
    conn = cluster.client()
    account = conn.get_auth()[0].rsplit("/", 1)[1]
    conn.put_container("pp")
    cluster.use_swift_conf()  # hash_path with the cluster's prefix and suffix
    return cluster, conn, account


def ring_step(cluster, command: str) -> None:
    """One swift-ring-builder step on the object ring, written out, and the servers
    that place objects restarted so that they use it at once."""
    builder = str(cluster.etc / "object.builder")
    for args in ((command,), ("write_ring",)):
        r = cluster.swift("swift-ring-builder", builder, *args)
        assert r.returncode == 0, f"swift-ring-builder {args}: {r.stdout}{r.stderr}"
    for server in ("object", "proxy"):
        cluster.restart_server(server)


def relinker(cluster, action: str) -> str:
    r = cluster.swift("swift-object-relinker", action, str(cluster.conf("object")))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out[-3000:]
    return out


def partition(account: str, name: str, part_power: int) -> int:
    return int(hash_path(account, "pp", name)[:8], 16) >> (32 - part_power)


def data_files(cluster, account: str, name: str, part_power: int) -> dict[str, list]:
    """Per device: the object's files in the partition it has at ``part_power``, with
    their link counts."""
    h = hash_path(account, "pp", name)
    part = partition(account, name, part_power)
    found = {}
    for dev in cluster.devices:
        d = cluster.node_root / dev.name / "objects" / str(part) / h[-3:] / h
        if d.is_dir():
            found[dev.name] = sorted((f, os.stat(d / f).st_nlink) for f in os.listdir(d))
    return found


def test_part_power_increase(env):
    cluster, conn, account = env
    old, new = cluster.part_power, cluster.part_power + 1
    objects = {f"o{i:03d}": rand_body((0, 10, 4096, 70000, 300 * 1024)[i % 5]) for i in range(40)}
    for name, data in objects.items():
        conn.put_object("pp", name, data, headers={"X-Object-Meta-Name": name})
    deleted = sorted(objects)[::7]
    for name in deleted:
        conn.delete_object("pp", name)
        del objects[name]

    def check_reads(step: str) -> None:
        for name, data in objects.items():
            hdrs, body = conn.get_object("pp", name)
            assert body == data and hdrs["etag"] == md5(data), (step, name)
            assert hdrs["x-object-meta-name"] == name, (step, name)
        _, listing = conn.get_container("pp", full_listing=True)
        assert sorted(o["name"] for o in listing) == sorted(objects), step

    ring_step(cluster, "prepare_increase_partition_power")
    # A PUT now lands in both partitions, as two names of one file.
    late = rand_body(5000)
    conn.put_object("pp", "late", late, headers={"X-Object-Meta-Name": "late"})
    objects["late"] = late
    moves = {name: partition(account, name, old) != partition(account, name, new) for name in [*objects, *deleted]}
    assert sum(moves.values()) >= len(moves) - 3  # (partition 0 stays where it is)
    linked = data_files(cluster, account, "late", new)
    links = 2 if moves["late"] else 1
    assert len(linked) == 3 and all(nl == links for files in linked.values() for _, nl in files), linked
    check_reads("prepare")

    relinker(cluster, "relink")
    for name in [*objects, *deleted]:
        in_old, in_new = data_files(cluster, account, name, old), data_files(cluster, account, name, new)
        assert in_new == in_old and len(in_new) == 3, (name, in_old, in_new)
        suffix = ".ts" if name in deleted else ".data"
        for files in in_new.values():
            assert len(files) == 1 and files[0][0].endswith(suffix), (name, files)
            assert files[0][1] == (2 if moves[name] else 1), (name, files)
    check_reads("relink")

    ring_step(cluster, "increase_partition_power")
    check_reads("increase")
    relinker(cluster, "cleanup")
    for name in objects:
        assert not moves[name] or not data_files(cluster, account, name, old), name
        in_new = data_files(cluster, account, name, new)
        assert len(in_new) == 3 and all(files == [(files[0][0], 1)] for files in in_new.values()), (name, in_new)
    check_reads("cleanup")

    ring_step(cluster, "finish_increase_partition_power")
    cluster.stop()
    assert not cluster.umount_all()
    cluster.mount_all()
    cluster.start()
    conn = cluster.client()
    check_reads("remount")
    for name in objects:
        assert len(data_files(cluster, account, name, new)) == 3, name
