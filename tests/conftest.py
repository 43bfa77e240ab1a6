from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from mounts import mounted  # noqa: E402


@pytest.fixture
def packdir(tmp_path: Path) -> Path:
    return tmp_path / "pack"


@pytest.fixture
def mnt(tmp_path: Path, packdir: Path) -> Iterator[Path]:
    """A freshly initialised packfs, mounted for the length of one test."""
    with mounted(packdir, tmp_path / "mnt") as m:
        yield m
