"""Zero-message opendir (option dircache, packfs/fuse/fuseshim.py) on a real mount.

The point is fewer FUSE requests: no OPENDIR or RELEASEDIR at all, and a directory
listed again while unchanged is answered by the kernel's cache. The promise is that
nothing else changes: a listing always shows the directory as it is, readers that
interleave see every entry once, and fsync of a directory still commits.
"""
from __future__ import annotations

import os
import subprocess

from fsutil import fsync_dir, without_reclaim, write_file
from mounts import PACKFS, kill9, mount, mounted, requests_served, stats, umount


def _shown(mnt) -> str:
    return subprocess.run([*PACKFS, "stats", str(mnt)], check=True, capture_output=True, text=True).stdout


ENDS = "listing ends answered in the shim"


def _counts(mnt) -> dict[str, int]:
    """The requests packfs's handlers served, by kind, and the listing ends its shim answered."""
    s = stats(mnt)
    return {**{op: v["count"] for op, v in s["operations"].items()}, ENDS: s["listing_ends_answered_in_shim"]}


def _grown(before: dict[str, int], after: dict[str, int], op: str) -> int:
    return after.get(op, 0) - before.get(op, 0)


def test_directories_open_without_a_request_and_listings_are_cached(mnt):
    assert stats(mnt)["zero_message_opendir"] is True
    assert "directories    open without a request" in _shown(mnt)
    assert "listing ends" in _shown(mnt)

    def listed_21_times(attempt: int) -> tuple[dict[str, int], ...]:
        d = mnt / f"d{attempt}"  # a directory the kernel has not listed yet
        d.mkdir()
        for i in range(50):
            write_file(d / f"f{i}", b"")
        before = _counts(mnt)
        first = sorted(os.listdir(d))
        middle = _counts(mnt)
        for _ in range(20):
            assert sorted(os.listdir(d)) == first
        return before, middle, _counts(mnt)

    before, middle, after = without_reclaim(listed_21_times)
    assert _grown(before, middle, "readdir") == 1  # the listing; the shim answered the empty reply that ends it
    assert _grown(before, middle, ENDS) == 1
    assert _grown(middle, after, "readdir") == 0  # twenty more listings, all from the kernel's cache
    assert _grown(middle, after, ENDS) == 0
    for op in ("opendir", "releasedir"):
        assert _grown(before, after, op) == 0


def test_a_changed_directory_is_listed_afresh(mnt):
    os.mkdir(mnt / "d")
    write_file(mnt / "d" / "a", b"")
    assert os.listdir(mnt / "d") == ["a"]
    write_file(mnt / "d" / "b", b"")
    assert sorted(os.listdir(mnt / "d")) == ["a", "b"]
    os.rename(mnt / "d" / "a", mnt / "c")
    assert os.listdir(mnt / "d") == ["b"]
    assert sorted(os.listdir(mnt)) == ["c", "d"]
    os.link(mnt / "c", mnt / "d" / "c2")
    os.unlink(mnt / "d" / "b")
    os.mkdir(mnt / "d" / "sub")
    assert sorted(os.listdir(mnt / "d")) == ["c2", "sub"]
    os.rmdir(mnt / "d" / "sub")
    os.symlink("c2", mnt / "d" / "s")
    assert sorted(os.listdir(mnt / "d")) == ["c2", "s"]


def test_interleaved_readers_of_one_directory_see_every_entry_once(mnt):
    names = {f"entry-{i:04d}-{'x' * 40}" for i in range(2000)}  # many readdir replies each
    for n in names:
        write_file(mnt / n, b"")
    os.mkdir(mnt / "other")
    iters = [os.scandir(mnt) for _ in range(3)]
    seen: list[list[str]] = [[] for _ in iters]
    try:
        done = [False] * len(iters)
        while not all(done):
            for k, it in enumerate(iters):
                if done[k]:
                    continue
                for _ in range(97 + 13 * k):  # readers at different paces
                    e = next(it, None)
                    if e is None:
                        done[k] = True
                        break
                    seen[k].append(e.name)
                os.listdir(mnt / "other")  # listings of another directory in between
    finally:
        for it in iters:
            it.close()
    for s in seen:
        assert len(s) == len(set(s))
        assert set(s) == names | {"other"}


def test_a_long_listing_is_read_in_several_replies_and_ends_in_the_shim(mnt):
    names = {f"entry-{i:04d}-{'y' * 60}" for i in range(3000)}
    os.mkdir(mnt / "d")
    for n in names:
        write_file(mnt / "d" / n, b"")
    before, ends_before = requests_served(mnt), stats(mnt)["listing_ends_answered_in_shim"]
    listed = os.listdir(mnt / "d")
    after = stats(mnt)
    assert len(listed) == len(set(listed)) and set(listed) == names
    assert _grown(before, requests_served(mnt), "readdir") > 1  # several replies of entries...
    assert after["listing_ends_answered_in_shim"] - ends_before == 1  # ...and one end, answered in C
    assert after["listings_open"] == 0  # the snapshot went with its last entry


def test_entries_removed_during_a_listing_are_not_shown_and_the_listing_ends(mnt):
    names = [f"entry-{i:04d}-{'z' * 60}" for i in range(3000)]
    os.mkdir(mnt / "d")
    for n in names:
        write_file(mnt / "d" / n, b"")
    seen = []
    ends_before = stats(mnt)["listing_ends_answered_in_shim"]
    with os.scandir(mnt / "d") as it:
        for e in it:
            seen.append(e.name)
            if len(seen) == 50:  # the first replies are in; remove the names listed last
                for n in names[-700:]:
                    os.unlink(mnt / "d" / n)
    assert stats(mnt)["listing_ends_answered_in_shim"] - ends_before == 1  # after the last entry not removed
    assert len(seen) == len(set(seen))
    assert set(names[:-700]) <= set(seen) <= set(names)
    assert sorted(os.listdir(mnt / "d")) == sorted(names[:-700])


def test_fsync_of_a_directory_commits_without_opendir(tmp_path, packdir):
    m = tmp_path / "mnt"
    with mounted(packdir, m):
        before = requests_served(m)
        os.makedirs(m / "a" / "b")
        write_file(m / "a" / "b" / "f", b"data", fsync=True)
        os.rename(m / "a" / "b" / "f", m / "a" / "g")
        fsync_dir(m / "a")
        after = requests_served(m)
        assert _grown(before, after, "fsyncdir") == 1
        assert _grown(before, after, "opendir") == 0
        kill9(packdir, m)
    mount(packdir, m)
    try:
        assert sorted(os.listdir(m / "a")) == ["b", "g"]
        assert (m / "a" / "g").read_bytes() == b"data"
    finally:
        umount(packdir, m)


def test_without_dircache_directories_are_opened_by_request(tmp_path, packdir):
    with mounted(packdir, tmp_path / "mnt", "nodircache") as m:
        assert stats(m)["zero_message_opendir"] is False
        assert "directories    opened by a FUSE request each" in _shown(m)
        os.mkdir(m / "d")
        write_file(m / "d" / "f", b"")
        before = requests_served(m)
        for _ in range(3):
            assert os.listdir(m / "d") == ["f"]
        after = requests_served(m)
        assert _grown(before, after, "opendir") == 3
        assert _grown(before, after, "releasedir") == 3
        assert _grown(before, after, "readdir") == 6  # each listing, and the empty reply that ends it
        assert stats(m)["listing_ends_answered_in_shim"] == 0
