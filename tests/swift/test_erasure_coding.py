"""Swift's erasure-coded policy on packfs: fragment archives, reconstruction, a dead device.

swift.conf's policy 1 (`ec`) cuts each object into 256 KiB segments, each into 2 data
and 1 parity fragments; every device of the object-1 ring keeps one fragment archive,
made durable by a second step of the PUT (a rename to `<ts>#<index>#d.data`).
"""
from __future__ import annotations

import os
import shutil

import pytest
from swift.obj.diskfile import read_metadata

from swiftenv import require_packfs
from swifthelpers import durable_fragment, fragment_dirs, md5, rand_body

SEGMENT = 262144
SIZES = [0, 1, 4096, SEGMENT, 2 * SEGMENT + 12345, (1 << 20) + 7]


@pytest.fixture(scope="module")
def env(cluster):
    conn = cluster.client()
    conn.put_container("ec", headers={"X-Storage-Policy": "ec"})
    assert conn.head_container("ec")["x-storage-policy"] == "ec"
    account = conn.get_auth()[0].rsplit("/", 1)[1]
    return cluster, conn, account, cluster.ring("object-1")


@pytest.mark.parametrize("size", SIZES)
def test_objects_read_back_and_each_device_holds_one_durable_fragment(env, size):
    cluster, conn, account, ring = env
    name, data = f"obj-{size}", rand_body(size)
    etag = conn.put_object("ec", name, data, headers={"X-Object-Meta-Size": str(size)})
    assert etag == md5(data)
    hdrs, body = conn.get_object("ec", name)
    assert body == data and hdrs["x-object-meta-size"] == str(size)
    assert int(conn.head_object("ec", name)["content-length"]) == size

    fragments = [durable_fragment(d) for _, d in fragment_dirs(cluster, ring, account, "ec", name)]
    assert len({ts for ts, _, _ in fragments}) == 1
    assert sorted(index for _, index, _ in fragments) == [0, 1, 2]
    # Each archive holds a fragment of every segment: about half the object, and the
    # same size on every device.
    assert len({len(archive) for _, _, archive in fragments}) == 1
    segments = max(1, -(-size // SEGMENT))
    assert size // 2 <= len(fragments[0][2]) <= size // 2 + segments * 4096, len(fragments[0][2])


def test_range_reads_across_segments(env):
    _, conn, _, _ = env
    data = rand_body(3 * SEGMENT + 100)
    conn.put_object("ec", "ranges", data)
    for start, end in ((0, 0), (SEGMENT - 10, SEGMENT + 10), (SEGMENT, 2 * SEGMENT - 1),
                       (100, 3 * SEGMENT + 99), (3 * SEGMENT, 3 * SEGMENT + 99)):
        _, body = conn.get_object("ec", "ranges", headers={"Range": f"bytes={start}-{end}"})
        assert body == data[start:end + 1], (start, end)


def test_overwrite_and_delete_leave_one_file_per_device(env):
    cluster, conn, account, ring = env
    conn.put_object("ec", "churn", rand_body(5000))
    newer = rand_body(SEGMENT + 3)
    conn.put_object("ec", "churn", newer)
    assert conn.get_object("ec", "churn")[1] == newer
    after_put = [durable_fragment(d) for _, d in fragment_dirs(cluster, ring, account, "ec", "churn")]
    assert len({ts for ts, _, _ in after_put}) == 1

    conn.delete_object("ec", "churn")
    for _, d in fragment_dirs(cluster, ring, account, "ec", "churn"):
        files = os.listdir(d)
        assert len(files) == 1 and files[0].endswith(".ts"), files
        assert files[0][:16] > after_put[0][0]


def test_reconstructor_rebuilds_a_lost_fragment_bit_for_bit(env):
    cluster, conn, account, ring = env
    data = rand_body(2 * SEGMENT + 999)
    conn.put_object("ec", "rebuilt", data, headers={"X-Object-Meta-Kind": "rebuilt"})
    (_, lost_dir), *_ = fragment_dirs(cluster, ring, account, "ec", "rebuilt")
    lost = durable_fragment(lost_dir)
    shutil.rmtree(lost_dir.parent.parent)  # the victim's whole partition

    devices = ",".join(d.name for d in cluster.devices)
    r = cluster.run_once("object-reconstructor", f"--devices={devices}")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out[-3000:]

    assert durable_fragment(lost_dir) == lost, out[-3000:]
    meta = read_metadata(str(lost_dir / os.listdir(lost_dir)[0]))
    assert meta["X-Object-Meta-Kind"] == "rebuilt"
    assert int(meta["X-Object-Sysmeta-Ec-Frag-Index"]) == lost[1]
    assert conn.get_object("ec", "rebuilt")[1] == data


def test_a_killed_device_costs_one_fragment_and_gives_it_back_after_recovery(env):
    """kill -9 of one daemon after the PUT: the proxy reads the object from the other two
    devices' fragments, and the remounted device has its durable fragment, intact."""
    require_packfs()
    cluster, conn, account, ring = env
    data = rand_body(SEGMENT + 4321)
    conn.put_object("ec", "survivor", data)
    (node, frag_dir), *_ = fragment_dirs(cluster, ring, account, "ec", "survivor")
    before = durable_fragment(frag_dir)
    dev = cluster.device(node["device"])

    cluster.crash_device(dev)
    try:
        for _ in range(3):
            assert conn.get_object("ec", "survivor")[1] == data
    finally:
        cluster.clear_dead_mount(dev)
        cluster.mount_device(dev)
    assert durable_fragment(frag_dir) == before
    assert conn.get_object("ec", "survivor")[1] == data
