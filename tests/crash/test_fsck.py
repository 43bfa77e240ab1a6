"""packfs fsck and fsck --repair on packs damaged by FaultDisk power cuts and by flipped bytes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from faultdisk import FaultDisk
from packfs import fsck
from packfs.core import pack
from packfs.store import records
from packfs.store.disk import Disk
from packs import KiB, lookup, run, small_options, tree, write_file

WRITES = ("pwrite", "truncate", "punch", "allocate", "fdatasync", "create", "fsync_dir")


def check(root: Path, disk=None) -> fsck.Report:
    lines: list[str] = []
    rep = fsck.check(str(root), disk=disk, out=lines.append)
    rep.lines = lines  # type: ignore[attr-defined]
    return rep


def repair(root: Path, disk=None) -> tuple[fsck.Report, list[str]]:
    lines: list[str] = []
    rep = fsck.check(str(root), repair=True, disk=disk, out=lines.append)
    return rep, lines


def kinds(rep: fsck.Report) -> set[str]:
    return {f.kind for f in rep.problems}


async def _three_files(fs) -> dict:
    await write_file(fs, "/objects/a/victim.data", b"v" * 5000 + b"MARKER-0123456789" + b"w" * 5000)
    await write_file(fs, "/objects/a/neighbour", os.urandom(7000), xattrs={b"user.swift.metadata": b"m" * 300})
    await write_file(fs, "/big", os.urandom(300 * KiB))
    return await tree(fs)


def _records(disk, root: Path, rtype: int | None = None) -> list[tuple[str, int, records.Header]]:
    """(volume path, offset, header) of every intact-headed record, by scanning the files."""
    out = []
    pid = pack.read_marker(str(root))["pack_id"]
    for name in sorted(disk.listdir(str(root / "volumes"))):
        fd = disk.open(str(root / "volumes" / name))
        size = disk.size(fd)
        for off in range(0, size, records.BLOCK):
            try:
                h = records.decode_header(disk.pread(fd, records.HEADER_SIZE, off), pid)
            except records.RecordError:
                continue
            if rtype is None or h.rtype == rtype:
                out.append((str(root / "volumes" / name), off, h))
        disk.close(fd)
    return out


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


# -- clean packs ------------------------------------------------------------------------------

def test_clean_pack_is_clean(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    run(root, Disk(), _three_files)
    rep = check(root)
    assert rep.exit_code == 0, rep.lines
    assert rep.lines[-1].endswith("clean"), rep.lines
    assert rep.files == 3 and rep.directories == 3


def test_cli_exit_codes(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    run(root, Disk(), _three_files)
    cli = [sys.executable, "-m", "packfs.cli", "fsck", str(root)]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path, off, h = [x for x in _records(Disk(), root, records.DATA) if x[2].length == 10017][0]
    _flip(path, off + records.HEADER_SIZE + 100)
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "/objects/a/victim.data" in r.stdout
    r = subprocess.run(cli + ["--repair"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "repair: moved /objects/a/victim.data to /lost+found/#" in r.stdout


def test_refuses_a_mounted_pack(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    run(root, Disk(), _three_files)
    held = pack.lock(str(root))  # what the daemon holds while mounted
    try:
        lines: list[str] = []
        assert fsck.fsck(str(root), out=lines.append) == 2
        assert fsck.fsck(str(root), repair=True, out=lines.append) == 2
        assert all("is mounted" in line for line in lines), lines
    finally:
        os.close(held)
    assert fsck.fsck(str(root), out=lambda line: None) == 0


# -- flipped bytes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["payload", "header"])
def test_flipped_byte_names_the_file_and_repair_quarantines_it(tmp_path: Path, where: str) -> None:
    root = tmp_path / "pack"
    before = run(root, Disk(), _three_files)
    path, off, h = [x for x in _records(Disk(), root, records.DATA) if x[2].length == 10017][0]
    _flip(path, off + (records.HEADER_SIZE + 5003 if where == "payload" else 20))
    rep = check(root)
    assert rep.exit_code == 1
    assert kinds(rep) >= {"corrupt-file"}, rep.lines
    named = [line for line in rep.lines if "corrupt" in line or "point" in line]
    assert any("/objects/a/victim.data" in line for line in named), rep.lines
    assert not any("neighbour" in line or "/big" in line for line in rep.lines), rep.lines

    final, lines = repair(root)
    assert final.exit_code == 0, lines
    ino = [line for line in lines if "moved /objects/a/victim.data" in line]
    assert ino, lines
    assert check(root).exit_code == 0

    after = run(root, Disk(), tree)
    for name in ("/objects/a/neighbour", "/big", "/objects/a/neighbour@"):
        assert after[name] == before[name]
    assert "/objects/a/victim.data" not in after
    lost = [k for k in after if k.startswith("/lost+found/#") and not k.endswith("@")]
    assert len(lost) == 1
    assert len(after[lost[0]]) == 10017  # the size stays; the damaged record became a hole
    assert b"victim.data" in after[lost[0] + "@"][fsck.XATTR]


def test_dangling_extent_and_catalog_damage(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    run(root, Disk(), _three_files)
    disk = Disk()
    # A referenced record punched away, as a buggy punch would.
    path, off, h = [x for x in _records(disk, root, records.DATA) if x[2].length == 7000][0]
    fd = os.open(path, os.O_RDWR)
    disk.punch_hole(fd, off, h.footprint)
    os.close(fd)
    # The catalog: a wrong link count, a name for a missing inode, an inode with no name.
    db = apsw.Connection(str(root / "catalog.sqlite"))
    big = db.execute("SELECT ino FROM dirents WHERE name = ?", (b"big",)).fetchall()[0][0]
    with db:
        db.execute("UPDATE inodes SET nlink = 5 WHERE ino = ?", (big,))
        db.execute("INSERT INTO dirents VALUES (1, ?, 999)", (b"ghost",))
        db.execute("DELETE FROM dirents WHERE name = ?", (b"victim.data",))
    db.close()
    rep = check(root)
    assert kinds(rep) >= {"corrupt-file", "nlink", "dangling-entry", "unreachable"}, rep.lines
    assert any("/objects/a/neighbour" in line and "point at nothing" in line for line in rep.lines), rep.lines
    final, lines = repair(root)
    assert final.exit_code == 0, lines
    after = run(root, Disk(), tree)
    assert "/ghost" not in after and "/objects/a/neighbour" not in after
    assert len(after["/big"]) == 300 * KiB
    assert sum(1 for k in after if k.startswith("/lost+found/#") and not k.endswith("@")) == 2
    assert check(root).exit_code == 0


# -- FaultDisk power cuts ------------------------------------------------------------------------------

def test_raw_crash_image_is_checked_without_writing(tmp_path: Path) -> None:
    """An unrecovered crash image: the uncommitted tail is a note, and fsck writes nothing."""
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs):
        await write_file(fs, "/kept", b"k" * 20000)
        await write_file(fs, "/unacked", b"u" * 70000, fsync=False)  # released: written, never committed
        await fs.volumes.wait_written(fs.volumes.last_ticket)
    run(root, disk, work, clean=False)
    image, _ = disk.power_cut(mode="all")
    image.record, image.trace = True, []
    rep = check(root, image)
    assert rep.exit_code == 0, rep.lines
    assert {f.kind for f in rep.notes} == {"uncommitted-tail"}, rep.lines
    assert not [ev for ev in image.trace if ev[0] in WRITES], image.trace
    after = run(root, image, tree)
    assert after == {"/kept": b"k" * 20000}


def test_unpunched_dead_records_listed_or_orphaned(tmp_path: Path) -> None:
    """Dead records a checkpoint could not punch: listed in the catalog, a note (mount
    punches them); no longer listed, orphans that --repair punches."""
    import errno as E
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs):
        for i in range(4):
            await write_file(fs, f"/f{i}", bytes([i]) * 9000)
        for i in range(4):
            await write_file(fs, f"/f{i}", bytes([i + 10]) * 5000)  # the first versions die
        fs.unlink(1, b"f3")
        await fs.fsync()
        disk.inject("punch", E.EIO, times=None)  # as if the power failed right after the catalog commit
        await fs.journal.checkpoint()
        disk.clear_faults()
        return await tree(fs)
    before = run(root, disk, work, clean=False)
    rep = check(root, disk)
    assert rep.exit_code == 0, rep.lines
    assert "dead-record" in {f.kind for f in rep.notes}, rep.lines
    # Forget the list: what is left are orphans.
    db = apsw.Connection(str(root / "catalog.sqlite"))
    with db:
        db.execute("DELETE FROM dead_records")
    db.close()
    rep = check(root, disk)
    assert rep.exit_code == 1
    assert kinds(rep) <= {"orphan-record", "stale-meta"} and "orphan-record" in kinds(rep), rep.lines
    final, lines = repair(root, disk)
    assert final.exit_code == 0, lines
    assert check(root, disk).exit_code == 0 and not check(root, disk).notes
    assert run(root, disk, tree) == before


def test_mount_punches_what_the_last_checkpoint_listed(tmp_path: Path) -> None:
    import errno as E
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs):
        await write_file(fs, "/x", b"x" * 9000)
        await write_file(fs, "/x", b"y" * 9000)
        disk.inject("punch", E.EIO, times=None)
        await fs.journal.checkpoint()
        disk.clear_faults()
    run(root, disk, work, clean=False)
    assert check(root, disk).notes
    image, _ = disk.power_cut(mode="none")
    run(root, image, tree)
    rep = check(root, image)
    assert rep.exit_code == 0 and not rep.notes, rep.lines


def test_damaged_commit_in_the_journal_keeps_later_commits(tmp_path: Path) -> None:
    """A flipped byte in a commit that later commits follow: mount refuses (rather than cut
    acknowledged commits, which their recorded flushed position proves); --repair keeps them."""
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs):
        await write_file(fs, "/a", b"a" * 3000)
        await write_file(fs, "/b", b"b" * 3000)
        await write_file(fs, "/c", b"c" * 3000)
    run(root, disk, work, clean=False)
    image, _ = disk.power_cut(mode="none")
    metas = _records(image, root, records.META)
    assert len(metas) == 3
    path, off, h = metas[1]
    image.corrupt(image.rel(path), off + records.HEADER_SIZE + 10, b"\xff\xfe")
    rep = check(root, image)
    assert "damaged-log" in kinds(rep), rep.lines
    assert rep.exit_code == 1
    final, lines = repair(root, image)
    assert final.exit_code == 0, lines
    after = run(root, image, tree)
    assert after["/a"] == b"a" * 3000 and after["/c"] == b"c" * 3000
    assert "/b" not in after  # its own commit is the damaged one
    assert check(root, image).exit_code == 0


def test_a_map_logged_as_edits_after_a_damaged_commit_is_named(tmp_path: Path) -> None:
    """Format 5 logs a long map as its edits since the previous commit: when that commit
    is damaged and a later one edits the map, --repair keeps the later commit but the
    ranges the lost one changed show older contents. fsck names the file."""
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))
    ino: list[int] = []

    async def work(fs):
        fs.ns.journal_edits_min = 2
        ino.append(await write_file(fs, "/db", b"0" * (64 * KiB), fsync=False))
        fh = fs.open(ino[0])
        try:
            for page in range(0, 64 * KiB, 8 * KiB):  # a map of many extents, logged whole
                await fs.write(fh, page, b"1" * 100)
            await fs.fsync()
            for mark, page in ((b"2", 0), (b"3", 32 * KiB)):  # two commits of its edits
                await fs.write(fh, page, mark * 100)
                await fs.fsync()
        finally:
            await fs.release(fh)
    run(root, disk, work, clean=False)
    image, _ = disk.power_cut(mode="none")
    metas = _records(image, root, records.META)
    path, off, _ = metas[-2]  # the commit of the first edit
    image.corrupt(image.rel(path), off + records.HEADER_SIZE + 10, b"\xff\xfe")
    rep = check(root, image)
    assert {"damaged-log", "stale-map"} <= kinds(rep), rep.lines
    assert any(f"inode {ino[0]}" in f.message for f in rep.problems if f.kind == "stale-map")
    final, lines = repair(root, image)
    assert any("older contents" in line and str(ino[0]) in line for line in lines), lines
    after = run(root, image, tree)["/db"]
    assert after[32 * KiB:32 * KiB + 100] == b"3" * 100  # the later commit is kept
    assert after[:100] == b"1" * 100  # the lost commit's edit is not


def test_torn_record_in_the_committed_log(tmp_path: Path) -> None:
    """Bytes of a committed record lost (a sector that never made it, found later): the file is named."""
    root = tmp_path / "pack"
    disk = FaultDisk(str(root))

    async def work(fs):
        await write_file(fs, "/dir/torn", os.urandom(12000))
        await write_file(fs, "/dir/fine", os.urandom(12000))
    run(root, disk, work)
    image, _ = disk.power_cut(mode="none")
    path, off, h = [x for x in _records(image, root, records.DATA)][0]
    image.corrupt(image.rel(path), off + 2 * 4096, bytes(4096))  # a zeroed sector in the middle
    rep = check(root, image)
    assert rep.exit_code == 1
    assert any("/dir/torn" in line and "corrupt" in line for line in rep.lines), rep.lines
    assert not any("/dir/fine" in line for line in rep.lines), rep.lines
    final, lines = repair(root, image)
    assert final.exit_code == 0, lines
    after = run(root, image, tree)
    assert "/dir/torn" not in after and len(after["/dir/fine"]) == 12000
    assert check(root, image).exit_code == 0


def test_damaged_catalog_and_not_a_pack(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    run(root, Disk(), _three_files)
    with open(root / "catalog.sqlite", "r+b") as f:
        f.write(b"this is no SQLite database anymore")
    for suffix in ("-wal", "-shm"):
        (root / ("catalog.sqlite" + suffix)).unlink(missing_ok=True)
    rep = check(root)
    assert rep.exit_code == 1 and kinds(rep) == {"catalog"}, rep.lines
    final, lines = repair(root)
    assert final.exit_code == 1 and any("not possible" in line for line in lines), lines
    other = tmp_path / "other"
    other.mkdir()
    lines = []
    assert fsck.fsck(str(other), out=lines.append) == 2
    assert "not a packfs pack directory" in lines[-1]


def test_progress_names_each_step(tmp_path: Path) -> None:
    """A long fsck says what it is doing; here every line is due at once (every=0)."""
    root = tmp_path / "pack"

    async def many_files(fs) -> None:
        for i in range(1100):
            await write_file(fs, f"/objects/{i % 7}/{i}.data", b"%d" % i, fsync=False)

    run(root, Disk(), many_files)
    lines: list[str] = []
    rep = fsck.check(str(root), out=lambda line: None, progress=fsck.Progress(every=0, write=lines.append))
    assert rep.exit_code == 0 and rep.data_records >= 1024
    assert any(line.startswith("reading volume 00000001.pack (1 of ") for line in lines), lines
    assert any(line.endswith("1,024 records checked") for line in lines), lines
    assert any("loading the catalog" in line for line in lines), lines
    assert any(line.startswith("cross-checking") for line in lines), lines
    quiet: list[str] = []
    fsck.check(str(root), out=lambda line: None, progress=fsck.Progress(every=3600, write=quiet.append))
    assert quiet == []  # a check shorter than the interval prints nothing


def test_xattrs_that_do_not_read_back_are_named_and_kept(tmp_path: Path, monkeypatch) -> None:
    """A blob in the Swift form that pickles back to other bytes (a pickler that changed)
    is a problem fsck names; repair leaves it, since the right pickler reads it."""
    import hashlib
    import pickle

    from packfs.namespace import xattrblob
    meta = pickle.dumps({b"name": b"/AUTH_test/c/o", b"X-Timestamp": b"1763872345.12345"}, 2)
    swift = {b"user.swift.metadata": meta, b"user.swift.metadata_checksum": hashlib.md5(meta).hexdigest().encode()}

    async def one_object(fs) -> None:
        await write_file(fs, "/objects/a/1763872345.12345.data", b"x" * 100, xattrs=swift)

    root = tmp_path / "pack"
    run(root, Disk(), one_object)
    assert check(root).exit_code == 0
    monkeypatch.setattr(xattrblob, "_swiftform", None)  # Python's pickler, made to write other bytes:
    monkeypatch.setattr(xattrblob, "_PICKLE_PROTOCOL", 3)
    rep = check(root)
    assert kinds(rep) == {"unreadable-xattrs"} and "/objects/a/1763872345.12345.data" in rep.problems[0].message
    rep, _ = repair(root)
    assert kinds(rep) == {"unreadable-xattrs"} and rep.exit_code == 1
    monkeypatch.undo()
    assert check(root).exit_code == 0

    async def read_back(fs) -> dict:
        return await tree(fs)
    assert run(root, Disk(), read_back)["/objects/a/1763872345.12345.data@"] == swift


def test_holes_past_fsck_read_chunks_leave_every_record_found(tmp_path: Path) -> None:
    """fsck reads a volume a 1 MiB chunk at a time. A record whose payload crossed a
    chunk's end made it read the next chunk from the payload's start, 48 bytes past a
    block; a punched hole to that chunk's end then left every later position 48 bytes
    off a block, and the records there "damaged": a healthy pack of an ad-hoc fuzz
    showed 6,909 files corrupt, and --repair would have made their data holes and
    punched live records. Volumes of 8 MiB, files of up to 40 KiB, half of them
    deleted and punched: every record must be found, and --repair must change nothing."""
    import random
    root = tmp_path / "pack"
    rng = random.Random(7)

    async def work(fs):
        for i in range(600):
            await write_file(fs, f"/d{i % 7}/f{i}", rng.randbytes(rng.randrange(1, 40 * KiB)), fsync=i % 5 == 0)
        for i in range(0, 600, 2):
            fs.unlink(lookup(fs, f"/d{i % 7}"), b"f%d" % i)
        await fs.fsync()
        await fs.journal.checkpoint()  # punches the dead records
        return await tree(fs)

    before = run(root, Disk(), work, small_options(volume_size=8 << 20))
    rep = check(root)
    assert rep.exit_code == 0 and not rep.problems, rep.lines[:5]
    assert rep.files == 300
    final, lines = repair(root)
    assert final.exit_code == 0 and not [line for line in lines if "moved" in line or "punch" in line], lines[:5]
    assert run(root, Disk(), tree) == before
