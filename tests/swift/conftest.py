"""Fixtures for stock Swift on real packfs mounts (tests/swift).

Every test here is marked ``swift``. A cluster (mount/swiftcluster.py: 4 packfs
devices, rings, memcached, rsyncd, proxy/account/container/object servers on
127.0.0.1) is module-scoped and always torn down: processes by PID, then every
mount unmounted.

PACKFS_SWIFT_BACKEND=dir runs the same tests on plain directories (the reference;
packfs-only tests skip). Without a working `packfs mount`, packfs tests skip.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swiftenv import BACKEND, SwiftCluster, require_backend, running  # noqa: E402


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.swift)


def make_cluster(tmp_path_factory, name: str, **kw) -> SwiftCluster:
    require_backend()
    run_dir = tmp_path_factory.mktemp(name)
    return SwiftCluster(run_dir, backend=BACKEND, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request) -> Iterator[SwiftCluster]:
    """A full cluster for one test module, its devices mounted with the module's
    MOUNT_OPTIONS if it has any."""
    c = make_cluster(tmp_path_factory, request.module.__name__.rsplit(".", 1)[-1],
                     mount_options=getattr(request.module, "MOUNT_OPTIONS", ""))
    with running(c):
        yield c
