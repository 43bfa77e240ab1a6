"""Every figure `packfs stats --json` gives is explained in docs/stats.md, the operator's
reference, and every mount option in the README's options table: a figure or a knob
added without its line there fails here."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from fsutil import write_file
from mounts import stats

from packfs.options import Options

ROOT = Path(__file__).resolve().parents[2]


def _documented(page: Path) -> set[str]:
    """The names a page's tables give in backquotes in their first column."""
    names = set()
    for line in page.read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z0-9_]+)", line.split(" | ")[0]))
    return names


def test_every_figure_of_stats_is_documented(mnt):
    write_file(mnt / "f", b"x" * 5000, fsync=True)  # so that operations and device have rows
    shown = stats(mnt)
    assert shown["operations"] and shown["device"]
    missing = set(shown) - _documented(ROOT / "docs" / "stats.md")
    assert not missing, f"docs/stats.md does not explain {sorted(missing)}"


def test_every_mount_option_is_in_the_readme():
    missing = {f.name for f in fields(Options)} - _documented(ROOT / "README.md")
    assert not missing, f"the README's options table lacks {sorted(missing)}"
