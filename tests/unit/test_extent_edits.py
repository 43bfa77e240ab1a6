"""Long extent maps are journaled as their edits since the previous commit (format 5).

A database rewritten in place keeps an extent per page it rewrote; a commit that logged
the whole map packed tens of thousands of extents each time. These drive a Filesystem
without FUSE, crash it (no final checkpoint) and check that recovery, which makes the
same edits to the map it holds, gives every byte back: across checkpoints, truncations,
commits taken in parts and an fsync that takes over such a commit.
"""
from __future__ import annotations

import marshal
import random

import pytest
import trio

from packfs.core import journal
from packfs.store import records
from packfs.core.filesystem import Filesystem, Setattr
from packfs.namespace.namespace import Namespace, ROOT
from packfs.core.recovery import PackDamaged
from test_recovery import REG, open_pack, packdir, read_via_pack, run  # noqa: F401 (packdir: a fixture)

SIZE = 256 << 10


class Model:
    """A file written at random offsets and sometimes truncated, and what it should hold."""

    def __init__(self, fs: Filesystem, seed: int) -> None:
        self.fs = fs
        self.rnd = random.Random(seed)
        self.ino = fs.create(ROOT, b"db", REG, 0, 0).ino
        self.fh = fs.open(self.ino)
        self.data = bytearray()

    async def step(self) -> None:
        rnd = self.rnd
        if rnd.random() < 0.03:
            size = rnd.randrange(0, SIZE)
            await self.fs.setattr(self.ino, Setattr(size=size))
            del self.data[size:]
            self.data.extend(bytes(size - len(self.data)))
            return
        pos, n = rnd.randrange(0, SIZE, 512), rnd.choice((512, 4096, 9000))
        chunk = rnd.randbytes(n)
        await self.fs.write(self.fh, pos, chunk)
        if pos > len(self.data):
            self.data.extend(bytes(pos - len(self.data)))
        self.data[pos:pos + n] = chunk


def counting_edits(monkeypatch) -> list[int]:
    """How many rows each snapshot logged as edits."""
    counts: list[int] = []
    real = Namespace.take_extent_edits

    def take(self, ino, wanted):
        edits = real(self, ino, wanted)
        counts.append(edits is not None)
        return edits

    monkeypatch.setattr(Namespace, "take_extent_edits", take)
    return counts


def test_a_long_map_is_journaled_as_its_edits_and_recovers_byte_for_byte(packdir, monkeypatch):
    counts = counting_edits(monkeypatch)
    expect: list[bytes] = []

    async def body(fs: Filesystem) -> None:
        fs.ns.journal_edits_min = 4
        m = Model(fs, 1)
        for i in range(600):
            await m.step()
            if i % 7 == 0:
                await fs.fsync()
            if i % 150 == 149:
                await fs.journal.checkpoint()
        await fs.fsync()
        assert len(fs.ns.table.extent_list(m.ino)) > 50
        expect.append(bytes(m.data))

    run(packdir, body, clean=False)
    assert sum(counts) > 50  # most commits logged the map as its edits
    assert read_via_pack(packdir, b"db") == expect[0]


def test_the_first_edits_after_a_checkpoint_edit_the_catalogs_map(packdir):
    """Recovery starts from the catalog, not from the METAs before its position: the
    checkpoint's own commit logs the edits made before it, and the next row's edits
    apply to the catalog's map."""
    expect: list[bytes] = []

    async def body(fs: Filesystem) -> None:
        fs.ns.journal_edits_min = 4
        m = Model(fs, 2)
        for _ in range(60):
            await m.step()
        await fs.fsync()
        for _ in range(20):
            await m.step()
        await fs.journal.checkpoint()  # its commit takes the map: these edits are in the catalog
        for _ in range(20):
            await m.step()
        await fs.fsync()
        expect.append(bytes(m.data))

    run(packdir, body, clean=False)
    assert read_via_pack(packdir, b"db") == expect[0]


@pytest.mark.parametrize("last_round", ["taken over", "staged"])
def test_commits_in_parts_log_whole_maps_and_an_fsync_that_takes_one_over_stays_exact(packdir, last_round):
    """A background commit snapshots in parts and logs maps whole (a key's newest take
    alone goes in its META); an fsync staged while it runs takes its changes back, and
    must log those maps whole too: the parts' takes had already restarted their edits.
    A wrong map lasts until a whole row comes, so the last round decides."""
    takeover = 1 if last_round == "taken over" else 0
    expect: list[bytes] = []

    async def body(fs: Filesystem) -> None:
        fs.ns.journal_edits_min = 4
        fs.journal.snapshot_part = 1
        m = Model(fs, 10)
        extra = [fs.create(ROOT, b"f%d" % i, REG, 0, 0).ino for i in range(6)]
        for _ in range(80):
            await m.step()
        await fs.fsync()
        for round_ in range(12):
            for _ in range(15):
                await m.step()
            fs.journal.wb.flush_all()
            assert fs.ns.extent_edits[m.ino]  # edits since the last commit
            for ino in extra:  # more keys than a part: the commit in parts takes turns
                await fs.setattr(ino, Setattr(mtime=round_))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fs.journal._commit_behind)
                while fs.ns.extent_edits[m.ino]:  # until a part takes the map
                    await trio.lowlevel.checkpoint()
                for _ in range(5):
                    await m.step()
                fs.journal.wb.flush_all()
                assert fs.ns.extent_edits[m.ino]
                if round_ % 2 == takeover:
                    await fs.fsync()  # takes the commit in parts over
            await fs.fsync()
        expect.append(bytes(m.data))

    run(packdir, body, clean=False)
    assert read_via_pack(packdir, b"db") == expect[0]


def test_a_short_map_and_a_non_file_are_logged_whole(packdir):
    async def body(fs: Filesystem) -> None:
        node = fs.create(ROOT, b"f", REG, 0, 0)
        fh = fs.open(node.ino)
        for i in range(10):
            await fs.write(fh, i * 8192, b"x" * 100)
        fs.journal.wb.flush_all()
        ns = fs.ns
        ns.journal_edits_min = 4
        assert ns.take_extent_edits(node.ino, True) is None  # first take: whole, and followed from here
        assert ns.take_extent_edits(ROOT, True) is None and ROOT not in ns.extent_edits
        await fs.write(fh, 0, b"y")
        fs.journal.wb.flush_all()
        assert ns.take_extent_edits(node.ino, True) is not None
        await fs.setattr(node.ino, Setattr(size=0))
        assert ns.take_extent_edits(node.ino, True) is None  # now shorter than its edits
        assert node.ino not in ns.extent_edits

    run(packdir, body, clean=True)


def test_recovery_refuses_edits_of_a_map_it_does_not_hold(packdir):
    """A bug, never a crash, could log them: recovery must not make up a map."""
    p = open_pack(packdir)
    try:
        row = (99, REG, 0, 0, 1, 10, 0, 0, 0, 0, None, None, [], 0)
        payload = marshal.dumps(([row], [], [], [], 100, (1, 0)), journal.MARSHAL_VERSION)
        with pytest.raises(ValueError, match="inode 99"):
            journal.apply(p.ns, payload)
        journal.apply(p.ns, payload, strict=False)  # fsck's repair past damage: an empty map
        assert p.ns.table.extent_list(99) == []
    finally:
        p.volumes.close()
        p.catalog.close()


def test_a_commit_whose_edits_do_not_apply_refuses_the_mount(packdir):
    async def body(fs: Filesystem) -> None:
        row = (99, REG, 0, 0, 1, 10, 0, 0, 0, 0, None, None, [], 0)
        payload = marshal.dumps(([row], [], [], [], 100, fs.journal.volumes.durable_pos), journal.MARSHAL_VERSION)
        volumes = fs.journal.volumes
        volumes.append(records.META, 0, 0, payload, sync=True)
        await volumes.wait_durable(volumes.last_ticket)

    run(packdir, body, clean=False)
    with pytest.raises(PackDamaged, match="does not apply: a journal row edits the extent map of inode 99"):
        open_pack(packdir)


def test_edits_are_let_go_once_they_outnumber_the_map(packdir):
    """Without a commit (commit_interval 0, no fsync), rewriting one range for ever
    would keep every edit: past the map's length the next commit logs it whole anyway."""
    async def body(fs: Filesystem) -> None:
        fs.ns.journal_edits_min = 4
        node = fs.create(ROOT, b"f", REG, 0, 0)
        fh = fs.open(node.ino)
        for i in range(8):
            await fs.write(fh, i * 8192, b"x" * 100)
        await fs.fsync()
        assert fs.ns.extent_edits[node.ino] == []
        for i in range(7):
            await fs.write(fh, 0, b"y" * 100)
            await fs.write(fh, 4096, b"y")  # not contiguous: the run before goes to the log
        assert node.ino not in fs.ns.extent_edits

    run(packdir, body, clean=True)


def test_edits_made_again_leave_the_map_as_once():
    from packfs.store import extents as ext
    from packfs.store.extents import pack_edits, replay_edits

    rnd = random.Random(5)
    live: list = []
    edits: list = []
    for i in range(300):
        if rnd.random() < 0.1:
            size = rnd.randrange(0, 1 << 20)
            ext.punch(live, size, ext.INFINITY)
            edits.append(size)
        else:
            n = rnd.randrange(1, 20000)
            e = (rnd.randrange(0, 1 << 20), n, 1, i * 4096 * 8, 0, n)
            ext.insert(live, e)
            edits.append(e)
    packed = pack_edits(edits)
    assert replay_edits([], packed) == live
    assert replay_edits(list(live), packed) == live  # every edit made a second time
    half = pack_edits(edits[:150])
    assert replay_edits(replay_edits([], half), pack_edits(edits[100:])) == live  # some of them twice
