"""bench/tablecost.py on a tree of 200 Swift objects: the parts add up to one walk of the
whole namespace, hold at least the columns and arenas the table counts itself, and the
table loaded from the catalog costs about what the image's does."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
pytest.importorskip("swift")  # the tree's metadata is written as Swift writes it
from bench import tablecost  # noqa: E402
from bench.scale import build_objects  # noqa: E402


def test_the_parts_add_up_and_agree_with_a_second_measurement(tmp_path: Path) -> None:
    build_objects(str(tmp_path / "source"), 0, 200, 64, "1700000000.00000", "source")
    r = tablecost.run(tmp_path / "source", tmp_path / "pack")
    assert r["loaded_from"] == "image"
    assert r["files"] == 200 and r["inodes"] > 2 * 200
    assert all(n >= 0 for n in r["parts"].values())
    assert sum(r["parts"].values()) == r["total"]
    # At least what the table counts of itself: its columns (the 8 B mtimes of every slot
    # among them), its names and its xattr values; the 200 objects' Swift metadata is in
    # their records, not in the table.
    columns = r["slots"] * (1 + 4 + 8 + 4 + 4 + 4 + 4 + 1)
    assert r["parts"]["mtime"] >= 8 * r["slots"]
    assert r["total"] >= columns + r["parts"]["names"] + r["parts"]["xblobs"]
    assert (r["xattr_blobs"], r["xattrs_in_records"]) == (0, 200)
    assert 0 < r["parts"]["xblobs"] < 200 * 8
    again = tablecost.measure(tmp_path / "pack", from_catalog=True)
    assert again["loaded_from"] == "catalog" and again["files"] == 200
    assert sum(again["parts"].values()) == again["total"]
    assert 0.8 * r["total"] <= again["total"] <= 1.25 * r["total"]
    assert "| **total** |" in tablecost.markdown(r)


def test_an_object_is_counted_once_and_shared_ones_not() -> None:
    value = b"x" * 100
    seen: set[int] = set()
    first = tablecost.deep_size({1000: value, 1001: value}, seen)
    assert first == tablecost.deep_size({1000: value, 1001: value}, set())
    assert tablecost.deep_size([value, 7, len], seen) == tablecost._alloc(sys.getsizeof([value, 7, len]))
