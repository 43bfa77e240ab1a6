"""Fixtures for the real-mount POSIX tests.

`mnt` and `packdir` (tests/conftest.py) give a packfs of the test's own. Most POSIX
semantics tests do not need a fresh daemon each: `work` is a fresh, empty directory
inside one packfs mount shared by the tests of a module, which keeps the suite fast.
Tests that unmount, crash or corrupt a pack use `mnt` (or `mounted`) instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from mounts import mounted


@pytest.fixture(scope="module")
def shared_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("shared")
    with mounted(base / "pack", base / "mnt") as m:
        yield base / "pack", m


@pytest.fixture
def work(shared_mount: tuple[Path, Path], request: pytest.FixtureRequest) -> Path:
    """A fresh empty directory (mode 0755, owned by root) on a shared packfs mount."""
    _, m = shared_mount
    d = m / request.node.name.replace("/", "_")[:200]
    os.mkdir(d, 0o755)
    return d


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
