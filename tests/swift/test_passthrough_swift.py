"""Stock Swift's object server on packfs devices mounted with `passthrough`: each object
is written by the kernel to a staging file and absorbed into the log (packfs/fuse/staging.py).
The object server tests of test_object_server.py that write and read objects run here
again, on such a cluster (MOUNT_OPTIONS: conftest.py's `cluster`)."""
from __future__ import annotations

import collections
import threading

import pytest
from swifthelpers import md5, rand_body
from test_object_server import (  # noqa: F401  (run again here, on passthrough mounts)
    DEV,
    osrv,
    test_objects_are_written_with_no_name_and_linked_into_place,
    test_overwrite_and_tombstones,
    test_put_get_head_delete,
    test_range_gets,
)

from mounts import stats

MOUNT_OPTIONS = "passthrough"


def test_an_objects_writes_reach_packfs_as_no_requests(osrv):
    if osrv.backend != "packfs":
        pytest.skip("reads packfs's statistics")
    device = osrv.root / DEV
    before = stats(device)
    if not before["passthrough"]["active"]:
        pytest.skip("the kernel did not take FUSE_PASSTHROUGH (Linux 6.9 and later, as root)")
    body = rand_body(1 << 20)
    for i in range(4):
        r = osrv.put(f"pt-{i}", body, chunked=bool(i % 2))
        assert r.status == 201 and r.etag == md5(body)
    after = stats(device)
    writes = after["operations"].get("write", {}).get("count", 0) - \
        before["operations"].get("write", {}).get("count", 0)
    assert writes <= 8  # hashes.invalid appends, not the objects' 64 KiB pieces (64 of them)
    assert after["passthrough"]["staged"] >= before["passthrough"]["staged"] + 4
    assert after["passthrough"]["absorbed_bytes"] >= before["passthrough"]["absorbed_bytes"] + 4 * len(body)
    for i in range(4):
        r = osrv.call("GET", f"pt-{i}")
        assert r.status == 200 and r.body == body


def test_gets_racing_puts_of_one_object_never_fail(osrv):
    """A GET may open an object between its PUT's linkat and the PUT's close, while the
    file is still open for passthrough: the kernel then allows only an open for
    passthrough on the same backing file, which packfs gives a reader (an EIO there was
    a 500 from the object server). Every GET answers 200 with one whole body or 404."""
    if osrv.backend == "packfs" and not stats(osrv.root / DEV)["passthrough"]["active"]:
        pytest.skip("the kernel did not take FUSE_PASSTHROUGH (Linux 6.9 and later, as root)")
    bodies = [rand_body(256 << 10, seed=i) for i in range(4)]
    etags = {md5(b) for b in bodies}
    done = threading.Event()
    got: list[tuple[int, str | None]] = []

    def get_until_done() -> None:
        while not done.is_set():
            r = osrv.call("GET", "raced")
            got.append((r.status, md5(r.body) if r.status == 200 else None))

    readers = [threading.Thread(target=get_until_done) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for i in range(120):
            assert osrv.put("raced", bodies[i % 4]).status == 201
    finally:
        done.set()
        for t in readers:
            t.join()
    statuses = collections.Counter(status for status, _ in got)
    assert set(statuses) <= {200, 404}, statuses
    assert statuses[200] > 0 and all(etag in etags for status, etag in got if status == 200)
