"""Where the Swift tests find the cluster runner, and which backend they use.

Test modules import from here rather than from conftest.py: several conftest.py
files in this repository share that module name.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator, Protocol

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "mount") not in sys.path:
    sys.path.insert(0, str(REPO / "mount"))

from swiftcluster import SwiftCluster, packfs_available  # noqa: E402,F401

BACKEND = os.environ.get("PACKFS_SWIFT_BACKEND", "packfs")


def require_backend() -> str:
    if BACKEND == "packfs":
        ok, why = packfs_available()
        if not ok:
            pytest.skip(f"packfs mount is not available yet: {why}")
    return BACKEND


def require_packfs() -> None:
    if BACKEND != "packfs":
        pytest.skip("needs real packfs mounts (PACKFS_SWIFT_BACKEND=dir)")
    require_backend()


class _Cluster(Protocol):
    def setup(self) -> None: ...

    def teardown(self) -> list[str]: ...


@contextlib.contextmanager
def running(cluster: _Cluster) -> Iterator[None]:
    """A cluster set up for the block and torn down after it, even when it fails; what
    could not be torn down (a mount, a namespace) fails the test."""
    cluster.setup()
    try:
        yield
    finally:
        errors = cluster.teardown()
        assert not errors, f"teardown errors: {errors}"
