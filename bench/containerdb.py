"""A Swift container database (SQLite) as a container server drives it, on any directory.

Container and account servers keep each database on the same devices as the objects
unless the operator gives them devices of their own, and SQLite writes a database in
place, 4 KiB pages at random offsets, with a rollback journal per transaction (Swift's
`journal_mode = DELETE`, `synchronous = NORMAL`). Without the kernel's writeback cache,
every one of those page writes is a FUSE request, where a local filesystem only copies
it into the page cache. Swift's own `ContainerBroker` does the work, in one process:

- build: `rows` object rows merged in transactions of 10,000 (as replication merges);
- updates: `updates` object PUTs' container updates, each through a new broker as the
  server makes one per request: `put_object` appends to the `.pending` file, and once
  that passes Swift's cap the update merges it into the database (the slow ones);
- merges: `merges` transactions of `batch` new rows at random names (`merge_items`, what
  a full pending file or a replication round makes): latency per transaction;
- listing: the whole container, 10,000 names a page, as a container GET lists it.

    python -m bench.containerdb DIR [--rows N] [--updates N] [--merges N] [--batch N]

prints the figures as JSON (rates per second, latencies in ms). DIR must be empty or
missing; the database stays there.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

from .util import latency_summary

BUILD_BATCH = 10_000
PAGE = 10_000


def _rows(rnd: random.Random, n: int, created: str) -> list[dict]:
    return [{"name": "o/%032x" % rnd.getrandbits(128), "created_at": created, "size": 4096,
             "content_type": "application/octet-stream", "etag": "d41d8cd98f00b204e9800998ecf8427e",
             "deleted": 0, "storage_policy_index": 0} for _ in range(n)]


def run(root: str, rows: int, updates: int, merges: int, batch: int) -> dict[str, float]:
    from swift.common.utils import Timestamp
    from swift.container.backend import ContainerBroker

    path = os.path.join(root, "containers", "c.db")
    os.makedirs(os.path.dirname(path))
    broker = ContainerBroker(path, account="a", container="c")
    broker.initialize(Timestamp.now().internal, 0)
    rnd = random.Random(1)
    out: dict[str, float] = {}

    start = time.perf_counter()
    for done in range(0, rows, BUILD_BATCH):
        broker.merge_items(_rows(rnd, min(BUILD_BATCH, rows - done), Timestamp.now().internal))
    out["build_rows_s"] = rows / (time.perf_counter() - start)

    lat = []
    start = time.perf_counter()
    for _ in range(updates):
        t = time.perf_counter()
        ContainerBroker(path, account="a", container="c").put_object(
            "u/%032x" % rnd.getrandbits(128), Timestamp.now().internal, 4096, "application/octet-stream",
            "d41d8cd98f00b204e9800998ecf8427e")
        lat.append(time.perf_counter() - t)
    out["updates_s"] = updates / (time.perf_counter() - start)
    out.update({f"update_{k}_ms": v for k, v in latency_summary(lat).items()})

    broker = ContainerBroker(path, account="a", container="c")
    broker.get_info()  # merges what the updates left pending, untimed
    lat = []
    for _ in range(merges):
        items = _rows(rnd, batch, Timestamp.now().internal)
        t = time.perf_counter()
        broker.merge_items(items)
        lat.append(time.perf_counter() - t)
    out.update({f"merge_{k}_ms": v for k, v in latency_summary(lat).items()})

    start, listed, marker = time.perf_counter(), 0, ""
    while page := broker.list_objects_iter(PAGE, marker, None, None, None):
        listed += len(page)
        marker = page[-1][0]
    out["list_rows_s"] = listed / (time.perf_counter() - start)
    expected = rows + updates + merges * batch
    if listed != expected:
        raise RuntimeError(f"listed {listed} rows, expected {expected}")
    out["db_mib"] = os.path.getsize(path) / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="an empty or missing directory on the filesystem to measure")
    ap.add_argument("--rows", type=int, default=100_000, help="rows in the database before the updates")
    ap.add_argument("--updates", type=int, default=5_000, help="container updates (put_object calls)")
    ap.add_argument("--merges", type=int, default=100, help="timed merge transactions")
    ap.add_argument("--batch", type=int, default=100, help="rows per timed merge")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if os.listdir(args.dir):
        raise SystemExit(f"{args.dir} is not empty")
    print(json.dumps({k: round(v, 3) for k, v in run(args.dir, args.rows, args.updates, args.merges,
                                                     args.batch).items()}))


if __name__ == "__main__":
    main()
