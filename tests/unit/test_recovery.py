"""Recovery without FUSE: drive a Filesystem inside trio, crash by not checkpointing, reopen.

A "crash" here stops the filesystem's tasks and closes its files without the final
checkpoint, as kill -9 leaves a pack: the catalog holds the last checkpoint, and the
volumes hold every record the appender wrote after it.
"""
from __future__ import annotations

import gc
import itertools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import pytest
import trio

from packfs.core import pack as packmod
from packfs.store import records
from packfs.namespace import xattrblob
from packfs.store.disk import Disk
from packfs.core.filesystem import Filesystem
from packfs.namespace.namespace import ROOT
from packfs.options import Options
from packfs.store.volumes import volume_name

REG = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755
MARK_UNCOMMITTED = b"<<uncommitted tail marker 0123456789>>"


def open_pack(path: Path) -> packmod.Pack:
    return packmod.open_pack(str(path), Disk(), 1 << 30, 8 << 20)


def run(path: Path, body: Callable[[Filesystem], Awaitable[None]], clean: bool,
        save_image: bool = False, commit_interval: float = 0) -> packmod.Pack:
    """Open the pack, run body on a started Filesystem, then close cleanly or crash.

    save_image: after a clean close, leave a namespace image, as the daemon does.
    commit_interval: off unless asked for, so what a test leaves uncommitted stays so."""
    p = open_pack(path)

    async def main() -> None:
        fs = Filesystem(p, Options(commit_interval=commit_interval))
        async with trio.open_nursery() as nursery:
            await fs.start(nursery)
            await body(fs)
            if clean:
                await fs.close()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
        if clean and save_image:
            p.save_image()
    finally:
        p.volumes.close()
        p.catalog.close()
    return p


async def write_file(fs: Filesystem, parent: int, name: bytes, data: bytes) -> int:
    node = fs.create(parent, name, REG, 0, 0)
    fh = fs.open(node.ino)
    for pos in range(0, len(data), 65536):
        await fs.write(fh, pos, data[pos:pos + 65536])
    await fs.release(fh)
    return node.ino


async def read_all(fs: Filesystem, ino: int) -> bytes:
    fh = fs.open(ino)
    try:
        return await fs.read(fh, 0, fs.getattr(ino).size + 1)
    finally:
        await fs.release(fh)


def lookup_path(p: packmod.Pack, path: bytes):
    node = p.ns.get(ROOT)
    for part in path.split(b"/"):
        node = p.ns.lookup(node.ino, part)
        if node is None:
            return None
    return node


def replayed_and_entries(path: Path, name: bytes) -> tuple[int, int]:
    """Reopen a crashed pack: how many commits recovery replayed, and how many entries
    the directory ROOT/name has."""
    p = open_pack(path)
    try:
        return p.recovery.replayed, len(p.ns.listdir(p.ns.lookup(ROOT, name).ino))
    finally:
        p.volumes.close()
        p.catalog.close()


def read_via_pack(path: Path, name: bytes) -> bytes | None:
    """Reopen the pack (replaying its log) and read one file's contents, or None if absent."""
    out: list[bytes | None] = []

    async def body(fs: Filesystem) -> None:
        node = lookup_path(fs.pack, name)
        out.append(None if node is None else await read_all(fs, node.ino))

    run(path, body, clean=True)
    return out[0]


def volume_bytes(path: Path) -> bytes:
    return b"".join(v.read_bytes() for v in sorted((path / "volumes").glob("*.pack")))


@pytest.fixture
def packdir(tmp_path) -> Path:
    d = tmp_path / "pack"
    packmod.initialise(str(d), Disk())
    return d


COMMITTED = {b"a": b"A" * 100_000, b"dir/b": bytes(range(256)) * 3000, b"dir/empty": b""}


async def make_committed(fs: Filesystem) -> None:
    d = fs.create(ROOT, b"dir", DIR, 0, 0)
    await write_file(fs, ROOT, b"a", COMMITTED[b"a"])
    await write_file(fs, d.ino, b"b", COMMITTED[b"dir/b"])
    await write_file(fs, d.ino, b"empty", b"")
    fs.setxattr(d.ino, b"user.k", b"v")
    await fs.fsync()


def test_committed_files_survive_crash_and_uncommitted_tail_is_cut(packdir):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        # After the commit: a new file whose data reaches the disk, but no commit covers it.
        await write_file(fs, ROOT, b"uncommitted", MARK_UNCOMMITTED * 1000)
        fs.unlink(ROOT, b"a")  # an uncommitted unlink
        await fs.volumes.wait_written(fs.volumes.last_ticket)

    run(packdir, body, clean=False)
    assert MARK_UNCOMMITTED in volume_bytes(packdir), "the test's uncommitted data never reached the volume"

    p = open_pack(packdir)
    try:
        assert p.recovery.replayed >= 1
        assert p.recovery.truncated_bytes > 0
        for name in COMMITTED:
            assert lookup_path(p, name) is not None, name
        assert lookup_path(p, b"uncommitted") is None
        assert p.ns.getxattr(lookup_path(p, b"dir").ino, b"user.k") == b"v"
        # The log now ends right after the last intact commit.
        vol = packdir / "volumes" / volume_name(p.volumes.active)
        assert vol.stat().st_size == p.volumes.tail
    finally:
        p.volumes.close()
        p.catalog.close()
    assert MARK_UNCOMMITTED not in volume_bytes(packdir), "the uncommitted tail was not cut off"
    for name, data in COMMITTED.items():
        assert read_via_pack(packdir, name) == data


def test_checkpoint_plus_replay(packdir):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        await fs.journal.checkpoint()
        await write_file(fs, ROOT, b"after-checkpoint", b"late" * 5000)
        await fs.fsync()
        fs.rename(ROOT, b"a", ROOT, b"a-renamed", 0)
        await fs.fsync()

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:
        assert p.recovery.replayed == 2  # only the commits after the checkpoint
        assert lookup_path(p, b"a") is None and lookup_path(p, b"a-renamed") is not None
    finally:
        p.volumes.close()
        p.catalog.close()
    assert read_via_pack(packdir, b"after-checkpoint") == b"late" * 5000
    assert read_via_pack(packdir, b"a-renamed") == COMMITTED[b"a"]
    # After a clean close there is nothing left to replay.
    p = open_pack(packdir)
    try:
        assert p.recovery.replayed == 0 and not p.recovery.changed
    finally:
        p.volumes.close()
        p.catalog.close()


def test_the_checkpoint_after_a_recovery_runs_in_the_background(packdir):
    """After a crash the mount serves before the checkpoint of what it replayed (on the
    hdd model its seeks into the catalog took 27 s), and that checkpoint still comes: a
    crash after it replays only what came later."""
    run(packdir, make_committed, clean=False)
    checkpoints_at_start: list[int] = []

    async def body(fs: Filesystem) -> None:
        checkpoints_at_start.append(fs.journal.checkpoints)
        with trio.fail_after(30):
            while fs.journal.checkpoints == 0:
                await trio.sleep(0.01)
        await write_file(fs, ROOT, b"after", b"late" * 100)
        await fs.fsync()

    run(packdir, body, clean=False)
    assert checkpoints_at_start == [0]
    p = open_pack(packdir)
    try:
        assert p.recovery.replayed == 1  # the commit after the background checkpoint
    finally:
        p.volumes.close()
        p.catalog.close()
    for name, data in COMMITTED.items():
        assert read_via_pack(packdir, name) == data
    assert read_via_pack(packdir, b"after") == b"late" * 100


def test_torn_write_batch_drops_its_commit(packdir):
    """A power cut may keep a commit's META but lose a data record of its batch."""
    marker = b"<<second batch data>>"

    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        await write_file(fs, ROOT, b"second", marker * 2000)
        await fs.fsync()

    run(packdir, body, clean=False)
    # Damage the second commit's data record, as a lost unflushed write would.
    vol = sorted((packdir / "volumes").glob("*.pack"))[-1]
    raw = bytearray(vol.read_bytes())
    pos = raw.find(marker)
    assert pos > 0
    raw[pos:pos + records.BLOCK] = bytes(records.BLOCK)
    vol.write_bytes(bytes(raw))

    p = open_pack(packdir)
    try:
        assert lookup_path(p, b"second") is None, "a commit whose batch is torn was applied"
        for name in COMMITTED:
            assert lookup_path(p, name) is not None
    finally:
        p.volumes.close()
        p.catalog.close()
    assert read_via_pack(packdir, b"dir/b") == COMMITTED[b"dir/b"]


def test_garbage_after_the_tail_is_cut(packdir):
    tail: list[tuple[int, int]] = []

    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        tail.append((fs.volumes.active, fs.volumes.tail))

    run(packdir, body, clean=False)
    active, end = tail[0]
    vol = packdir / "volumes" / volume_name(active)
    with open(vol, "r+b") as f:
        # Right after the last commit: a torn record header, then junk, as a crash
        # in the middle of an append leaves them.
        f.seek(end)
        f.write(b"".join(records.encode(records.DATA, 999, 5, 0, [b"x" * 10000], 1))[:30] + b"\xde\xad" * 3000)
    p = open_pack(packdir)
    try:
        assert (p.volumes.active, p.volumes.tail) == (active, end)
        assert vol.stat().st_size == end
    finally:
        p.volumes.close()
        p.catalog.close()
    for name, data in COMMITTED.items():
        assert read_via_pack(packdir, name) == data


def test_recovery_is_repeatable(packdir):
    """A crash during recovery only means running it again."""
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        await write_file(fs, ROOT, b"tail", b"t" * 70_000)
        await fs.volumes.wait_written(fs.volumes.last_ticket)

    run(packdir, body, clean=False)
    first = open_pack(packdir)
    names1 = sorted(n for n, _ in first.ns.listdir(ROOT))
    first.volumes.close()
    first.catalog.close()
    second = open_pack(packdir)
    names2 = sorted(n for n, _ in second.ns.listdir(ROOT))
    second.volumes.close()
    second.catalog.close()
    assert names1 == names2 == [b"a", b"dir"]


def test_unlinked_open_file_is_dropped_at_recovery(packdir):
    async def body(fs: Filesystem) -> None:
        await make_committed(fs)
        node = fs.create(ROOT, b"tmpfile", REG, 0, 0)
        fh = fs.open(node.ino)
        await fs.write(fh, 0, b"z" * 10_000)
        await fs.fsync()
        fs.unlink(ROOT, b"tmpfile")  # still open at the crash
        await fs.fsync()

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:
        assert lookup_path(p, b"tmpfile") is None
        assert p.recovery.orphans == 1
        assert all(node.nlink > 0 for node in p.ns)
    finally:
        p.volumes.close()
        p.catalog.close()


def test_many_commits_and_overwrites_replay_in_order(packdir):
    async def body(fs: Filesystem) -> None:
        ino = await write_file(fs, ROOT, b"f", b"v0" * 1000)
        await fs.fsync()
        for i in range(1, 30):
            fh = fs.open(ino)
            await fs.write(fh, 500 * i, b"v%d" % i)
            await fs.release(fh)
            await fs.fsync()

    run(packdir, body, clean=False)
    expect = bytearray(b"v0" * 1000)
    for i in range(1, 30):
        piece = b"v%d" % i
        end = 500 * i + len(piece)
        if end > len(expect):
            expect.extend(bytes(end - len(expect)))
        expect[500 * i:end] = piece
    assert read_via_pack(packdir, b"f") == bytes(expect)


def test_a_format_1_pack_is_upgraded_in_place_when_opened(packdir):
    """Formats 2 and 3 only add compressed xattrs: a format-1 pack opens, keeps everything,
    and says the current format."""
    import json

    from packfs import FORMAT_VERSION
    run(packdir, make_committed, clean=True)
    p = open_pack(packdir)
    with p.catalog.db:
        p.catalog.db.execute("UPDATE settings SET value = 1 WHERE key = 'format'")
    p.volumes.close()
    p.catalog.close()
    marker = packdir / packmod.MARKER
    info = json.loads(marker.read_text())
    marker.write_text(json.dumps({**info, "format": 1}))
    p = open_pack(packdir)
    try:
        assert json.loads(marker.read_text())["format"] == FORMAT_VERSION
        assert p.catalog.settings["format"] == FORMAT_VERSION
        assert p.ns.lookup(p.ns.lookup(ROOT, b"dir").ino, b"b").size == len(COMMITTED[b"dir/b"])
        assert p.ns.getxattr(p.ns.lookup(ROOT, b"dir").ino, b"user.k") == b"v"
    finally:
        p.volumes.close()
        p.catalog.close()
    marker.write_text(json.dumps({**info, "format": FORMAT_VERSION + 1}))
    with pytest.raises(packmod.PackError, match="format"):
        open_pack(packdir)


def test_a_commit_bigger_than_the_prepared_space_is_never_zeroed(packdir, monkeypatch):
    """A META past the preallocated space extends the volume; later growth (in the
    background or for a writer) must not write zeros over it or over what follows."""
    from packfs.store import volumes as V
    monkeypatch.setattr(V, "PREALLOC_STEP", 256 << 10)
    monkeypatch.setattr(V, "PREALLOC_AHEAD", 1 << 20)
    files = {}

    async def body(fs: Filesystem) -> None:
        top = fs.create(ROOT, b"many", DIR, 0, 0)
        for i in range(30_000):  # one commit of 30k inodes: a META of several MiB
            node = fs.create(top.ino, b"f%06d" % i, REG, 0, 0)
            fs.setxattr(node.ino, b"user.k", os.urandom(120))
        await fs.fsync()
        assert fs.volumes.tail > 2 << 20
        for i in range(20):  # then data that makes the volume grow again and again
            files[b"d%d" % i] = os.urandom(1 << 20)
            await write_file(fs, ROOT, b"d%d" % i, files[b"d%d" % i])
            await fs.fsync()

    run(packdir, body, clean=False)  # crash: recovery must replay the big commit and the rest

    async def check(fs: Filesystem) -> None:
        for name, data in files.items():
            assert await read_all(fs, fs.lookup(ROOT, name).ino) == data
        assert len(fs.ns.listdir(fs.lookup(ROOT, b"many").ino)) == 30_000

    run(packdir, check, clean=True)


def test_many_changes_without_fsync_are_committed_in_bounded_pieces(packdir):
    from packfs.namespace.namespace import COMMIT_INODES

    async def body(fs: Filesystem) -> None:
        top = fs.create(ROOT, b"many", DIR, 0, 0)
        for round_ in (1, 2):  # nobody calls fsync
            for i in range(COMMIT_INODES):
                fs.create(top.ino, b"f%d-%07d" % (round_, i), REG, 0, 0)
            with trio.fail_after(60):
                while fs.journal.commits < round_:
                    await trio.sleep(0.01)  # the background committer runs
        await fs.volumes.wait_durable(fs.volumes.last_ticket)  # as the committer itself waits

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:  # what the background commits covered survives a crash
        assert len(p.ns.listdir(p.ns.lookup(ROOT, b"many").ino)) == 2 * COMMIT_INODES
    finally:
        p.volumes.close()
        p.catalog.close()


def test_changes_nobody_fsyncs_are_committed_within_the_interval(packdir):
    data = os.urandom(300_000)

    async def body(fs: Filesystem) -> None:
        top = fs.create(ROOT, b"rsynced", DIR, 0, 0)
        await write_file(fs, top.ino, b"obj.data", data)
        fs.setxattr(fs.lookup(top.ino, b"obj.data").ino, b"user.k", b"v")
        with trio.fail_after(30):
            while fs.journal.commits == 0:
                await trio.sleep(0.01)  # nobody calls fsync: the interval commits
        assert not fs.ns.journal_changes and not fs.wb.dirty
        await fs.volumes.wait_durable(fs.volumes.last_ticket)  # as the committer itself waits
        await trio.sleep(0.3)  # three more intervals: nothing changed, so no empty commit
        assert fs.journal.commits == 1

    run(packdir, body, clean=False, commit_interval=0.1)

    async def check(fs: Filesystem) -> None:
        node = fs.lookup(fs.lookup(ROOT, b"rsynced").ino, b"obj.data")
        assert await read_all(fs, node.ino) == data
        assert await fs.getxattr(node.ino, b"user.k") == b"v"

    run(packdir, check, clean=True)


def test_the_store_says_when_it_has_freed_memory(packdir):
    """After a checkpoint, and at the first quiet interval after commits (the daemon hands
    its heap back to the kernel then), not at every idle interval."""
    async def body(fs: Filesystem) -> None:
        freed: list[int] = []

        async def note() -> None:
            freed.append(fs.journal.commits)

        fs.journal.on_memory_freed = note
        await write_file(fs, ROOT, b"a", b"x" * 5000)
        await fs.fsync()
        with trio.fail_after(30):
            while not freed:
                await trio.sleep(0.01)
        await trio.sleep(0.3)  # six more quiet intervals
        assert freed == [1]
        await fs.journal.checkpoint()
        assert freed == [1, 1]

    run(packdir, body, clean=True, commit_interval=0.05)


def test_a_quiet_disk_checkpoints_once_enough_waits_for_it(packdir, monkeypatch):
    """A commit interval without a commit checkpoints if QUIET_CHECKPOINT_INODES changed
    inodes or QUIET_CHECKPOINT_FREES dead records wait; fewer wait for the next one."""
    from packfs.core import journal
    monkeypatch.setattr(journal, "QUIET_CHECKPOINT_INODES", 50)
    monkeypatch.setattr(journal, "QUIET_CHECKPOINT_FREES", 2)

    async def checkpoints(fs: Filesystem, n: int) -> None:
        with trio.fail_after(30):
            while fs.journal.checkpoints < n:
                await trio.sleep(0.01)

    async def body(fs: Filesystem) -> None:
        top = fs.create(ROOT, b"d", DIR, 0, 0)
        for i in range(60):
            fs.create(top.ino, b"f%d" % i, REG, 0, 0)
        await write_file(fs, ROOT, b"x", b"x" * 5000)
        await write_file(fs, ROOT, b"y", b"y" * 5000)
        await fs.fsync()
        await checkpoints(fs, 1)
        assert not fs.ns.catalog_changes
        fs.unlink(ROOT, b"x")
        await fs.fsync()
        await trio.sleep(0.5)  # ten quiet intervals: one dead record and two inodes wait
        assert fs.journal.checkpoints == 1 and len(fs.ns.frees) == 1
        fs.unlink(ROOT, b"y")
        await fs.fsync()
        await checkpoints(fs, 2)  # two dead records: punched now
        assert not fs.ns.frees

    run(packdir, body, clean=False, commit_interval=0.05)
    assert replayed_and_entries(packdir, b"d") == (0, 60)  # the quiet checkpoints covered every commit


def test_a_failing_checkpoint_on_a_quiet_disk_is_logged_once_and_retried(packdir, monkeypatch, caplog):
    from packfs.core import journal
    monkeypatch.setattr(journal, "QUIET_CHECKPOINT_INODES", 5)

    async def body(fs: Filesystem) -> None:
        attempts = []
        real = fs.journal.catalog.checkpoint

        def failing(*args):
            attempts.append(1)
            raise OSError(5, "the catalog's disk is gone")

        fs.journal.catalog.checkpoint = failing
        top = fs.create(ROOT, b"d", DIR, 0, 0)
        for i in range(10):
            fs.create(top.ino, b"f%d" % i, REG, 0, 0)
        await fs.fsync()
        with trio.fail_after(30):
            while len(attempts) < 3:
                await trio.sleep(0.01)  # every quiet interval tries again
        fs.journal.catalog.checkpoint = real
        with trio.fail_after(30):
            while fs.journal.checkpoints == 0:
                await trio.sleep(0.01)
        assert not fs.ns.catalog_changes  # what the failed ones took went into this one

    run(packdir, body, clean=False, commit_interval=0.02)
    assert sum("checkpoint failed" in r.getMessage() for r in caplog.records) == 1
    assert replayed_and_entries(packdir, b"d") == (0, 10)


SWIFT_META = b"\x80\x02}q\x00(X\x04\x00\x00\x00nameq\x01X\x0e\x00\x00\x00/AUTH_test/c/o" + b"X-Timestamp" * 20


def is_compressed(blob: bytes | None) -> bool:
    return blob is not None and xattrblob.is_compressed(blob)


def test_xattrs_are_compressed_after_the_commit_and_replay_plain_or_not(packdir):
    """setxattr stores plain; the background compresses in the turns after the commits
    that follow (two turns after the last change; an fsync with nothing to commit is no
    turn); a crash replays the plain form the commit logged, compresses it again, and
    loses nothing."""
    async def body(fs: Filesystem) -> None:
        ino = await write_file(fs, ROOT, b"obj", b"x" * 4096)
        fs.setxattr(ino, b"user.swift.metadata", SWIFT_META)
        assert not is_compressed(fs.ns.table.packed_xattrs(ino))
        await fs.fsync()
        for _ in range(3):
            await fs.fsync()  # nothing to commit: no turn
            await trio.sleep(0.01)
        assert not is_compressed(fs.ns.table.packed_xattrs(ino))
        with trio.fail_after(10):
            for turn in itertools.count():
                if is_compressed(fs.ns.table.packed_xattrs(ino)):
                    break
                await trio.sleep(0.001)  # the compressor runs once a commit is queued
                fs.setxattr(ROOT, b"user.turn", b"%d" % turn)  # a change, so a commit
                await fs.fsync()

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:
        ino = lookup_path(p, b"obj").ino
        assert p.recovery.replayed >= 1
        assert p.ns.getxattr(ino, b"user.swift.metadata") == SWIFT_META
        assert p.ns.table.compress_xattrs() is False and is_compressed(p.ns.table.packed_xattrs(ino))
    finally:
        p.volumes.close()
        p.catalog.close()

    async def checkpointed(fs: Filesystem) -> None:
        ino = fs.lookup(ROOT, b"obj").ino
        fs.setxattr(ino, b"user.swift.metadata", SWIFT_META + b"2")
        await fs.journal.checkpoint()  # compresses what waits before the catalog takes it

    run(packdir, checkpointed, clean=True)
    p = open_pack(packdir)
    try:
        ino = lookup_path(p, b"obj").ino
        assert is_compressed(p.catalog.xattrs_of(ino))  # the catalog holds them small
        assert is_compressed(p.ns.table.packed_xattrs(ino))
        assert p.ns.getxattr(ino, b"user.swift.metadata") == SWIFT_META + b"2"
    finally:
        p.volumes.close()
        p.catalog.close()


def test_a_directory_number_a_file_took_in_the_same_commit_replays(packdir):
    """A directory emptied and removed, and its number reused by a new file, all in one
    commit: that commit carries the removed child's entry under a number that is now a
    file's, which replay must skip (loading the file's row dropped the old entries)."""
    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0)
        await write_file(fs, d.ino, b"f", b"child")
        await fs.fsync()
        fs.unlink(d.ino, b"f")
        fs.rmdir(ROOT, b"d")
        assert await write_file(fs, ROOT, b"g", b"reused") == d.ino  # the last number freed
        await fs.fsync()

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:
        assert p.recovery.replayed >= 2
        assert lookup_path(p, b"d") is None
        assert lookup_path(p, b"g") is not None
    finally:
        p.volumes.close()
        p.catalog.close()
    assert read_via_pack(packdir, b"g") == b"reused"


class Staged:
    """Wraps a journal's _stage: the namespace after each staging, by the log position
    after it (states), the last position, and how many stagings were given keywords (a
    background commit's or an fsync's, not a checkpoint's) or a commit in parts' layers."""

    def __init__(self, fs: Filesystem) -> None:
        self.fs, self.stage = fs, fs.journal._stage
        self.states: dict[tuple[int, int], tuple] = {}
        self.last: tuple[int, int] | None = None
        self.with_keywords = self.behind = 0
        fs.journal._stage = self

    def __call__(self, *args, **kwargs) -> None:
        from test_catalog import dump
        self.with_keywords += bool(kwargs)
        self.behind += kwargs.get("behind") is not None
        self.stage(*args, **kwargs)
        volumes = self.fs.journal.volumes
        self.last = (volumes.active, volumes.tail)
        self.states[self.last] = dump(self.fs.ns)


@dataclass
class Changer:
    """Changes the files f000... of directory d (files: their inodes, kept current), one
    change per turn of the event loop, for ever: renames out and back, xattrs,
    replacements, overwrites, new directories. n counts the changes made."""
    fs: Filesystem
    d: int
    files: list[int]
    n: int = 0

    async def run(self) -> None:
        fs, d, files = self.fs, self.d, self.files
        while True:
            n, i = self.n, self.n % len(files)
            name = b"f%03d" % i
            if n % 5 == 0:
                fs.rename(d, name, ROOT, name, 0)
                fs.rename(ROOT, name, d, name, 0)
            elif n % 5 == 1:
                fs.setxattr(files[i], b"user.n", b"%d" % n)
            elif n % 5 == 2:
                fs.unlink(d, name)
                files[i] = await write_file(fs, d, name, b"new %d" % n)
            elif n % 5 == 3:
                fh = fs.open(files[i])
                await fs.write(fh, 3, b"overwritten %d" % n)
                await fs.release(fh)
            else:
                fs.create(d, b"new%d" % n, DIR, 0, 0)
            self.n += 1
            await trio.lowlevel.checkpoint()


def test_a_checkpoint_taken_in_parts_holds_the_namespace_as_at_its_last_commit(packdir, monkeypatch):
    """Requests and background commits change the namespace between the parts of a
    checkpoint's snapshot: the catalog must still hold it exactly as at one commit, the
    checkpoint's last, whose position it records; recovery replays what came after."""
    from packfs.namespace import namespace
    from packfs.core.catalog import Catalog
    from packfs.core.recovery import load_namespace
    from test_catalog import dump
    monkeypatch.setattr(namespace, "COMMIT_INODES", 10)  # background commits between the parts too
    staged: list[Staged] = []

    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0).ino
        files = [await write_file(fs, d, b"f%03d" % i, b"%d" % i * 100) for i in range(200)]
        await fs.fsync()
        staged.append(Staged(fs))
        fs.journal.snapshot_part = 7
        changer = Changer(fs, d, files)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(changer.run)
            await fs.journal.checkpoint()
            nursery.cancel_scope.cancel()
        # changes and commits came between the parts
        assert changer.n > 20 and staged[0].with_keywords > 2

    run(packdir, body, clean=False)
    states = staged[0].states
    cat = Catalog(str(packdir / "catalog.sqlite"))
    try:
        assert dump(load_namespace(cat)) == states[cat.settings["volume"], cat.settings["offset"]]
    finally:
        cat.close()
    p = open_pack(packdir)
    try:
        assert dump(p.ns) == states[staged[0].last]  # and recovery replays the commits after it
    finally:
        p.volumes.close()
        p.catalog.close()


def test_a_commit_taken_in_parts_holds_the_namespace_as_at_its_staging(packdir, monkeypatch):
    """Requests change the namespace between the parts of background commits' snapshots:
    each META must still hold it exactly as at its staging, so that recovery gives the
    namespace as at the last commit."""
    from packfs.namespace import namespace
    from test_catalog import dump
    monkeypatch.setattr(namespace, "COMMIT_INODES", 100_000)  # only the commits below
    staged: list[Staged] = []

    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0).ino
        files = [await write_file(fs, d, b"f%03d" % i, b"%d" % i * 100) for i in range(100)]
        await fs.fsync()
        staged.append(Staged(fs))
        volumes = fs.journal.volumes
        fs.journal.snapshot_part = 3
        for i in range(100):
            fs.setxattr(files[i], b"user.n", b"before")
        changer = Changer(fs, d, files)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(changer.run)
            for _ in range(3):
                n = changer.n
                while changer.n == n:  # else a commit may come right after the last and take nothing
                    await trio.lowlevel.checkpoint()
                await fs.journal._commit_behind()
            nursery.cancel_scope.cancel()
        await volumes.wait_durable(volumes.last_ticket)  # what came after is lost in the crash
        assert staged[0].behind == 3 and changer.n > 30  # changes came between the parts

    run(packdir, body, clean=False)
    p = open_pack(packdir)
    try:
        assert dump(p.ns) == staged[0].states[staged[0].last]
    finally:
        p.volumes.close()
        p.catalog.close()


def test_an_fsync_during_a_commit_in_parts_makes_the_parts_durable(packdir, monkeypatch):
    """An fsync staged while a background commit is in its second round of parts commits
    what that commit took in both, though the background commit never stages."""
    from packfs.namespace import namespace
    monkeypatch.setattr(namespace, "COMMIT_INODES", 1000)  # no background commit of its own

    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0).ino
        await fs.fsync()
        for i in range(30):
            await write_file(fs, d, b"f%03d" % i, b"data %d" % i)
        fs.journal.snapshot_part = 3
        volumes, ensure_space = fs.journal.volumes, fs.journal.volumes.ensure_space

        async def never_for_the_background_commit(*args, **kwargs) -> None:
            if trio.lowlevel.current_task().name.endswith("_commit_behind"):
                await trio.sleep_forever()  # after its parts: it never stages
            await ensure_space(*args, **kwargs)

        volumes.ensure_space = never_for_the_background_commit
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.journal._commit_behind)
            while fs.ns.journal_changes.inodes:  # until the background commit takes them
                await trio.lowlevel.checkpoint()
            for i in range(30, 40):  # more than a part: a second round takes them
                await write_file(fs, d, b"f%03d" % i, b"data %d" % i)
            while fs.ns.journal_changes.inodes:
                await trio.lowlevel.checkpoint()
            assert fs.journal.uncommitted_inodes > 40
            await fs.fsync()
            nursery.cancel_scope.cancel()
        assert fs.journal.uncommitted_inodes == 0

    run(packdir, body, clean=False)
    assert replayed_and_entries(packdir, b"d")[1] == 40


def test_a_checkpoint_that_fails_after_its_parts_gives_back_what_it_took(packdir):
    import errno
    from packfs.errors import FsError

    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0)
        for i in range(50):
            fs.create(d.ino, b"f%d" % i, REG, 0, 0)
        await fs.fsync()
        fs.journal.snapshot_part = 7
        volumes, real = fs.journal.volumes, fs.journal.volumes.ensure_space
        calls = []

        async def full_before_the_last_commit(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:  # the checkpoint's second: after the parts, before its last commit
                raise FsError(errno.ENOSPC)
            return await real(*args, **kwargs)

        volumes.ensure_space = full_before_the_last_commit
        with pytest.raises(FsError):
            await fs.journal.checkpoint()
        assert gc.isenabled()  # the failed checkpoint gave the collector back too
        volumes.ensure_space = real
        assert fs.ns.catalog_changes.inode_count >= 51
        await fs.journal.checkpoint()

    run(packdir, body, clean=False)
    assert replayed_and_entries(packdir, b"d") == (0, 50)


def test_a_checkpoint_runs_without_automatic_collections_and_restores_them(packdir, monkeypatch):
    from packfs.core import journal

    seen = []
    real_snapshot = journal.snapshot

    def snapshot(ns, changes, **how):
        seen.append(gc.isenabled())
        return real_snapshot(ns, changes, **how)

    monkeypatch.setattr(journal, "snapshot", snapshot)

    async def body(fs: Filesystem) -> None:
        d = fs.create(ROOT, b"d", DIR, 0, 0)
        for i in range(20):
            fs.create(d.ino, b"f%d" % i, REG, 0, 0)
        fs.journal.snapshot_part = 7
        write = fs.journal._write_catalog
        fs.journal._write_catalog = lambda *args: (seen.append(gc.isenabled()), write(*args))[1]
        await fs.journal.checkpoint()
        assert gc.isenabled()

    run(packdir, body, clean=True)
    assert len(seen) > 3 and not any(seen)
