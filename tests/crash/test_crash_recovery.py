"""Recovery is idempotent: a power cut at any step of recovery (the tail cut, the
post-recovery checkpoint, its punches) and a second recovery give the same tree."""
from __future__ import annotations

import os
import random
from pathlib import Path

import apsw

import campaign
from faultdisk import FaultDisk
from packs import run, write_file


def test_power_cut_at_every_step_of_recovery(tmp_path: Path) -> None:
    root = str(tmp_path / "pack")
    disk = FaultDisk(root)
    opts = campaign.options()

    async def work(fs) -> None:
        for i in range(6):
            await write_file(fs, f"/d/f{i}", os.urandom(20000 + i))
        await fs.journal.checkpoint()
        for i in range(3):
            await write_file(fs, f"/d/f{i}", os.urandom(9000))  # records that die after the checkpoint
        fs.open(fs.lookup(fs.lookup(1, b"d").ino, b"f5").ino)  # held open until the crash
        fs.unlink(fs.lookup(1, b"d").ino, b"f5")  # unlinked while open: an orphan inode
        await fs.fsync()
        for i in range(8):  # enough log to roll over into another volume
            await write_file(fs, f"/e/g{i}", os.urandom(60000))
        await write_file(fs, "/unacked", os.urandom(50000), fsync=False)  # the uncommitted tail
        await fs.volumes.wait_written(fs.volumes.last_ticket)
    run(root, disk, work, opts=opts, clean=False)
    image, _ = disk.power_cut(mode="all")  # what kill -9 leaves: every write, nothing more
    db = apsw.Connection(os.path.join(root, "catalog.sqlite"))
    blob = db.serialize("main")
    db.close()

    runner = campaign.Runner(1, 0, str(tmp_path))
    base = image.snapshot()
    first = image.snapshot()
    first.record = True
    expected, problems, _ = runner.recover(root, first, blob, instrument=True)
    assert expected is not None, problems
    kinds = [ev[0] if ev[0] != "mark" else ev[1] for ev in first.trace]
    assert "truncate" in kinds and "catalog" in kinds and "punch" in kinds, kinds
    assert len(expected.files) == 13  # f0-f4 and g0-g7; f5's orphan inode dropped; unacked never there

    rng = random.Random(5)
    points = 0
    for k, sim in FaultDisk.replayer(first.trace, root, base=base):
        for mode in ("none", "all", "random", "random"):
            img, _ = sim.power_cut(rng, mode)
            _, _, cblob = runner.state_at(runner.index_marks(first.trace), k)
            again, problems, position = runner.recover(root, img, cblob if k and cblob != b"" else blob)
            assert again is not None, (k, problems)
            assert again.sig() == expected.sig(), f"crash at step {k} of recovery ({kinds[k - 1] if k else 'start'})"
            assert runner.fsck_problems(root, img, position) == [], k
            points += 1
    assert points >= 4 * len(first.trace)


def test_recovery_in_the_same_boot_flushes_what_it_replays(tmp_path: Path) -> None:
    """kill -9 before a commit's flush, mount again in the same boot, then a power cut.

    The second mount reads the commit from the page cache, replays it, and its
    post-recovery checkpoint names it in the catalog; unless recovery flushed it, the
    power cut loses the records the catalog now refers to. (The volume ending right
    after the commit, as a roll-over's trim leaves it, means no tail cut flushes it.)
    """
    import errno

    import pytest

    from packfs.errors import FsError
    from packs import by_the_appender, small_options, tree

    root = str(tmp_path / "pack")
    disk = FaultDisk(root)

    async def work(fs) -> None:
        await write_file(fs, "/base", b"b" * 5000)
        disk.inject("fdatasync", errno.EIO, times=1, when=by_the_appender)
        with pytest.raises(FsError):
            await write_file(fs, "/unflushed", b"u" * 9000)  # written, never flushed, never acknowledged
        v = fs.volumes
        disk.truncate(v.fd(v.active), v.tail)
    run(root, disk, work, opts=small_options(), clean=False)
    killed = disk.snapshot()  # kill -9: the page cache, pending writes included, survives
    first = run(root, killed, tree, opts=small_options())
    assert first == {"/base": b"b" * 5000, "/unflushed": b"u" * 9000}  # replayed from the page cache
    image, _ = killed.power_cut(mode="none")
    after = run(root, image, tree, opts=small_options())
    assert after == first
    from packfs import fsck
    rep = fsck.check(root, disk=image)
    # Only what the cut's lost punches leave (see docs/crash-safety.md, holes found).
    assert {f.kind for f in rep.problems} <= {"orphan-record", "stale-meta"}, [f.message for f in rep.problems]
