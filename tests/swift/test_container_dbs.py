"""Swift's container databases (SQLite files) on packfs: replication and sharding.

Account and container servers keep each database in a hash directory of the device,
with its journal, `.pending` appends and, when a container is sharded, new databases
made, renamed and removed beside it. These run Swift's own daemons for that.
"""
from __future__ import annotations

import shutil

import pytest
from swift.common import direct_client
from swift.common.utils import hash_path

from swifthelpers import md5


@pytest.fixture(scope="module")
def env(cluster):
    conn = cluster.client()
    account = conn.get_auth()[0].rsplit("/", 1)[1]
    return cluster, conn, account, cluster.ring("container")


def db_dir(cluster, node: dict, part: int, account: str, container: str):
    h = hash_path(account, container)
    return cluster.node_root / node["device"] / "containers" / str(part) / h[-3:] / h


def run_daemon(cluster, daemon: str, *args: str) -> str:
    r = cluster.run_once(daemon, *args)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out[-3000:]
    return out


def put_objects(conn, container: str, names) -> dict[str, bytes]:
    bodies = {name: name.encode() * 3 for name in names}
    for name, body in bodies.items():
        conn.put_object(container, name, body)
    return bodies


def test_the_replicator_restores_a_lost_container_db(env):
    cluster, conn, account, ring = env
    conn.put_container("lost", headers={"X-Container-Meta-Color": "blue"})
    put_objects(conn, "lost", [f"o{i:02d}" for i in range(30)])
    part, nodes = ring.get_nodes(account, "lost")
    victim, source = nodes[0], nodes[1]
    shutil.rmtree(db_dir(cluster, victim, part, account, "lost"))
    with pytest.raises(direct_client.ClientException) as e:
        direct_client.direct_head_container(victim, part, account, "lost")
    assert e.value.http_status == 404

    run_daemon(cluster, "container-replicator", f"--devices={source['device']}", f"--partitions={part}")
    hdrs = direct_client.direct_head_container(victim, part, account, "lost")
    assert int(hdrs["X-Container-Object-Count"]) == 30
    assert hdrs["X-Container-Meta-Color"] == "blue"
    _, listing = direct_client.direct_get_container(victim, part, account, "lost")
    assert [o["name"] for o in listing] == [f"o{i:02d}" for i in range(30)]


def test_sharding_a_container(env):
    """swift-manage-shard-ranges cuts a 120-object container into shards of 30 rows; the
    sharder cleaves it over a few passes. The listing stays whole and in order, and
    objects PUT afterwards land in the shards (redirected, via the object updater)."""
    cluster, conn, account, ring = env
    conn.put_container("big")
    bodies = put_objects(conn, "big", [f"obj-{i:04d}" for i in range(120)])
    part, nodes = ring.get_nodes(account, "big")
    db = db_dir(cluster, nodes[0], part, account, "big")
    r = cluster.swift("swift-manage-shard-ranges", str(db / f"{db.name}.db"), "find_and_replace", "30",
                      "--enable", "--force")
    assert r.returncode == 0, r.stdout + r.stderr

    def states() -> list[str]:
        return [direct_client.direct_head_container(n, part, account, "big").get("X-Backend-Sharding-State")
                for n in nodes]

    passes = []
    for _ in range(6):
        passes.append(run_daemon(cluster, "container-sharder"))
        if states() == ["sharded"] * 3:
            break
    assert states() == ["sharded"] * 3, passes[-1][-3000:]
    ranges = direct_client.direct_get_container(nodes[0], part, account, "big",
                                                headers={"X-Backend-Record-Type": "shard"})[1]
    assert len(ranges) == 4, ranges

    _, listing = conn.get_container("big", full_listing=True)
    assert [o["name"] for o in listing] == sorted(bodies)
    assert all(o["hash"] == md5(bodies[o["name"]]) for o in listing)

    later = put_objects(conn, "big", [f"obj-{i:04d}" for i in range(120, 130)] + ["a-first", "zz-last"])
    bodies.update(later)
    run_daemon(cluster, "object-updater")
    _, listing = conn.get_container("big", full_listing=True)
    assert [o["name"] for o in listing] == sorted(bodies)
    for name in ("a-first", "obj-0125", "zz-last"):
        assert conn.get_object("big", name)[1] == bodies[name]
