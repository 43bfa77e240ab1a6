"""`packfs import` without FUSE: a tree with every kind of file imported and read back
from the pack's namespace and records; what it refuses; an interrupted import, refused
by mount and fsck and started over by the next import."""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import stat
from pathlib import Path

import pytest
import trio

import sourcetree
from packfs import cli, fsck
from packfs.core import journal, pack
from packfs.core.filesystem import Filesystem
from packfs.importer import ImportFailed, build, reader, run_import, source, walk
from packfs.namespace.inodes import ROOT
from packfs.namespace.xattrblob import compressed, is_compressed
from packfs.options import Options
from packfs.progress import Progress
from packfs.store.disk import Disk


def pack_records(packdir: Path) -> dict[bytes, dict]:
    """The pack's tree as sourcetree.records gives a directory's, read from its namespace and
    records (blocks aside: packfs counts its own)."""
    p = pack.open_pack(str(packdir), Disk(), 1 << 30, 8 << 20)
    try:
        return trio.run(_walk, Filesystem(p, Options(commit_interval=0)))
    finally:
        p.volumes.close()
        p.catalog.close()


async def _walk(fs: Filesystem) -> dict[bytes, dict]:
    out: dict[bytes, dict] = {}
    names: dict[int, list[bytes]] = {}
    todo = [(b".", ROOT)]
    while todo:
        rel, ino = todo.pop()
        node = fs.getattr(ino)
        names.setdefault(ino, []).append(rel)
        atime, mtime, ctime = node.times()
        r = {"type": stat.S_IFMT(node.mode), "mode": stat.S_IMODE(node.mode), "uid": node.uid, "gid": node.gid,
             "nlink": node.nlink, "rdev": node.rdev, "atime": atime, "mtime": mtime, "ctime": ctime, "ino": ino,
             "size": node.size, "xattrs": {os.fsdecode(n): v for n, v in sorted((node.xattrs or {}).items())}}
        if node.target is not None:
            r["target"] = node.target
        if node.is_reg:
            r["sha256"] = hashlib.sha256(await fs.wb.read(node, 0, node.size)).hexdigest()
            r["data_bytes"] = fs.wb.data_bytes(node)
        out[rel] = r
        for name, child in node.children():
            todo.append((name if rel == b"." else rel + b"/" + name, child))
    for r in out.values():
        r["group"] = min(names[r.pop("ino")])
    return out


def _comparable(records: dict[bytes, dict], symlink_atimes: bool = True) -> dict[bytes, dict]:
    """Without what packfs counts its own way (blocks, the data bytes) and, where the source
    was read-write, symlinks' atimes: reading a link sets its atime, and the import must
    read it after it took its times."""
    out = {}
    for path, r in records.items():
        r = {k: v for k, v in r.items() if k not in ("blocks", "data_bytes")}
        if not symlink_atimes and r["type"] == stat.S_IFLNK:
            del r["atime"]
        out[path] = r
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    sourcetree.build(src, big_xattrs=False)  # (ext4 keeps an inode's xattrs in one block)
    return src


@pytest.mark.parametrize("often", [False, True], ids=["defaults", "checkpoint-every-7-inodes"])
def test_every_kind_of_file_is_kept(tmp_path, tree, monkeypatch, often):
    """With a checkpoint every few inodes too, so that background checkpoints run beside
    the walk and take what changes during their parts."""
    if often:
        monkeypatch.setattr(build, "CHECKPOINT_INODES", 7)
        monkeypatch.setattr(build, "TURN_ENTRIES", 1)
        monkeypatch.setattr(build, "BATCH_FILES", 3)
    done = run_import(str(tree), str(tmp_path / "pack"))
    want = sourcetree.records(tree)
    got = pack_records(tmp_path / "pack")
    assert _comparable(got, symlink_atimes=False) == _comparable(want, symlink_atimes=False)
    # Holes stay holes: the records hold the data alone.
    assert got[b"sparse"]["data_bytes"] == 4096 + 8192
    assert got[b"all-hole"]["data_bytes"] == 0 and got[b"all-hole"]["size"] == 3 << 20
    assert got[b"sparse-head"]["data_bytes"] <= 4096 + 4
    # Hard links are links.
    assert got[b"b/c/third name"]["group"] == got[b"a/linked"]["group"] == b"a/linked"
    assert got[b"a/linked"]["nlink"] == 3
    t = done.tally
    assert (t.links, t.symlinks, t.specials) == (3, 3, 4)  # a/linked has two more names, empty one
    assert t.files == sum(1 for r in want.values() if r["type"] == stat.S_IFREG) - t.links
    assert t.data_bytes == sum(r["data_bytes"] for path, r in got.items() if "data_bytes" in r and path == r["group"])
    assert pack.read_marker(str(tmp_path / "pack"))["format"]  # a pack now (no longer an import's)
    assert not (tmp_path / "pack" / pack.IMPORTING).exists()


def test_swift_metadata_is_kept_in_its_compact_form(tmp_path, tree):
    """A listing gives user.swift.metadata_checksum before user.swift.metadata on XFS and
    ext4 alike; set in that order, the inode table could not keep them in Swift's form.
    (The object's record carries them as they were set: compressed, they take that form.)"""
    run_import(str(tree), str(tmp_path / "pack"))
    p = pack.open_pack(str(tmp_path / "pack"), Disk(), 1 << 30, 8 << 20)
    try:
        node = p.ns.get(ROOT)
        for name in b"objects/1023/abc/00000000000000000000000000000abc/1700000000.12345.data".split(b"/"):
            node = p.ns.lookup(node.ino, name)
        x = p.ns.table.packed_xattrs(node.ino)
        assert (x if is_compressed(x) else compressed(x))[:2] == b"\xff\xfd"  # format 4's Swift form
    finally:
        p.volumes.close()
        p.catalog.close()


def test_the_image_left_serves_a_default_mount_and_either_setting_checks_the_same(tmp_path, tree):
    """The import leaves the image a mount with the default xattrs_in_memory loads; and the
    pack holds the xattrs it made, whether its values are loaded or left in records and the
    catalog (verify counts both)."""
    from packfs.importer.verify import differences
    done = run_import(str(tree), str(tmp_path / "pack"))
    for keep in (Options().xattrs_in_memory, not Options().xattrs_in_memory):
        p = pack.open_pack(str(tmp_path / "pack"), Disk(), 1 << 30, 8 << 20, xattrs_in_memory=keep)
        try:
            assert p.loaded_from == ("image" if keep == Options().xattrs_in_memory else "catalog")
            assert differences(p, done.tally) == []
            if not keep:
                assert p.ns.table.xattrs_in_catalog() > 0  # empty-with-xattr and directories' among them
        finally:
            p.volumes.close()
            p.catalog.close()


def test_a_path_longer_than_path_max_is_imported(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    fd = os.open(src, os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 names of 250 bytes: 5,000 bytes below src
            os.mkdir(b"d" * 250, dir_fd=fd)
            deeper = os.open(b"d" * 250, os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        leaf = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
        os.write(leaf, b"far below")
        os.close(leaf)
        os.symlink("leaf", "link", dir_fd=fd)
    finally:
        os.close(fd)
    run_import(str(src), str(tmp_path / "pack"))
    got = pack_records(tmp_path / "pack")
    far = b"/".join([b"d" * 250] * 20)
    assert got[far + b"/leaf"]["sha256"] == hashlib.sha256(b"far below").hexdigest()
    assert got[far + b"/link"]["target"] == b"leaf"


def _refusal(source: Path, packdir: Path) -> str:
    with pytest.raises(ImportFailed) as e:
        run_import(str(source), str(packdir))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_what_it_refuses_it_leaves_as_it_was(tmp_path, tree):
    assert "does not exist" in _refusal(tmp_path / "nothing", tmp_path / "p1")
    (tmp_path / "file").write_bytes(b"x")
    assert "is not a directory" in _refusal(tmp_path / "file", tmp_path / "p2")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_bytes(b"mine")
    assert "is not empty" in _refusal(tree, full)
    assert os.listdir(full) == ["keep"]
    assert "is not a directory" in _refusal(tree, tmp_path / "file")
    assert "inside SOURCE" in _refusal(tree, tree / "pack")
    assert not (tree / "pack").exists()
    run_import(str(tree), str(tmp_path / "pack"))
    before = sorted(os.listdir(tmp_path / "pack"))
    assert "holds a pack already" in _refusal(tree, tmp_path / "pack")
    assert sorted(os.listdir(tmp_path / "pack")) == before
    assert not any(n.startswith("p") for n in os.listdir(tmp_path) if n not in ("pack",))


def test_it_runs_as_root_alone(tmp_path, tree, monkeypatch):
    """Another user's listings leave trusted.* xattrs out: the copy would lack them unsaid."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "runs as root" in _refusal(tree, tmp_path / "pack")
    assert not (tmp_path / "pack").exists()


def test_an_xattr_packfs_cannot_keep_is_refused_by_name(tmp_path, tree, monkeypatch):
    real = source.xattrs

    def with_an_acl(target, path):
        pairs = real(target, path)
        return pairs + [(b"system.posix_acl_access", b"\x02\0\0\0")] if path.endswith(b"/medium") else pairs
    monkeypatch.setattr(source, "xattrs", with_an_acl)
    message = _refusal(tree, tmp_path / "pack")
    assert "medium has the xattr system.posix_acl_access, which packfs cannot keep" in message


def test_an_interrupted_import_is_refused_and_the_next_starts_over(tmp_path, tree, monkeypatch, capsys):
    packdir = tmp_path / "pack"
    made = 0
    original = build.TreeBuilder._file

    async def interrupted(self, *args):
        nonlocal made
        made += 1
        if made == 5:
            raise KeyboardInterrupt
        await original(self, *args)
    monkeypatch.setattr(build.TreeBuilder, "_file", interrupted)
    assert cli.main(["import", str(tree), str(packdir)]) == 130
    assert "holds an unfinished import" in capsys.readouterr().err
    assert (packdir / pack.IMPORTING).exists() and not (packdir / pack.MARKER).exists()
    # Nothing takes it for a pack.
    with pytest.raises(pack.PackError, match="unfinished packfs import"):
        pack.read_marker(str(packdir))
    assert fsck.check(str(packdir)).exit_code == 2
    (tmp_path / "mnt").mkdir()
    with pytest.raises(SystemExit) as refused:
        cli.main(["mount", str(packdir), str(tmp_path / "mnt")])
    assert refused.value.code == 1 and "unfinished packfs import" in capsys.readouterr().err
    # The next import clears it and starts over.
    monkeypatch.setattr(build.TreeBuilder, "_file", original)
    done = run_import(str(tree), str(packdir))
    assert done.restarted and "cleared first" in done.summary()
    assert _comparable(pack_records(packdir), False) == _comparable(sourcetree.records(tree), False)


def test_an_unfinished_import_beside_other_files_is_not_cleared(tmp_path, tree):
    packdir = tmp_path / "pack"
    pack.initialise(str(packdir), Disk(), importing=True)
    (packdir / "notes.txt").write_text("the operator's")
    assert "refusing to clear it" in _refusal(tree, packdir)
    assert (packdir / "notes.txt").exists() and (packdir / pack.IMPORTING).exists()


def test_progress_lines_and_the_summary(tmp_path, tree):
    lines: list[str] = []
    done = run_import(str(tree), str(tmp_path / "pack"), Progress(every=0, write=lines.append, command="import"))
    assert any("files/s" in line for line in lines) and lines[-1] == "checking the pack"
    summary = done.summary()
    assert "\n" not in summary and f"{done.tally.files:,} files" in summary and "Checked:" in summary


def test_the_cli_says_why_in_one_line(tmp_path, capsys):
    assert cli.main(["import", str(tmp_path / "missing"), str(tmp_path / "pack")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("packfs import: SOURCE") and "does not exist" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["import", "--help"])
    assert e.value.code == 0 and "packfs.json.importing" in capsys.readouterr().out


def test_a_source_that_shrinks_while_read_is_refused(tmp_path, tree, monkeypatch):
    def short(fd, n, offset):
        return b""
    monkeypatch.setattr(os, "pread", short)
    assert "shrank while it was read" in _refusal(tree, tmp_path / "pack")


def test_a_source_read_error_names_the_file(tmp_path, tree, monkeypatch):
    real = source.SourceDir.open

    def fails(self, name):
        if name == b"medium":
            raise source.failed(self.path + b"/" + name, OSError(errno.EIO, os.strerror(errno.EIO)))
        return real(self, name)
    monkeypatch.setattr(source.SourceDir, "open", fails)
    message = _refusal(tree, tmp_path / "pack")
    assert message == f"cannot read {tree}/medium: Input/output error"


def _children() -> set[int]:
    """This process's child processes, zombies included."""
    kids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            kids.update(map(int, f.read().split()))
    return kids


def test_a_reader_process_that_dies_stops_the_import_in_one_line(tmp_path, tree, monkeypatch):
    real = walk.items

    def dies(root, piece):
        for n, item in enumerate(real(root, piece)):
            if n == 20:
                os.kill(os.getpid(), signal.SIGKILL)  # (in the reader process)
            yield item
    monkeypatch.setattr(walk, "items", dies)
    before = _children()
    assert _refusal(tree, tmp_path / "pack") == "the process reading SOURCE stopped: killed by SIGKILL"
    assert _children() == before  # reaped


def test_the_reader_process_is_killed_and_reaped_when_the_builder_stops(tmp_path, tree, monkeypatch):
    async def interrupted(self, *args):
        raise KeyboardInterrupt
    monkeypatch.setattr(build.TreeBuilder, "_file", interrupted)
    monkeypatch.setattr(reader, "BATCH_ITEMS", 1)  # so that the reader is still walking
    before = _children()
    with pytest.raises(KeyboardInterrupt):
        run_import(str(tree), str(tmp_path / "pack"))
    assert _children() == before


def test_a_builder_faster_than_its_checkpoints_waits_for_them(tmp_path, tree, monkeypatch):
    """Each checkpoint takes all that changed since the one before: with checkpoints that
    never keep up, that grew with the tree, and the snapshot's rows with it."""
    monkeypatch.setattr(build, "CHECKPOINT_INODES", 4)
    monkeypatch.setattr(build, "TURN_ENTRIES", 1)
    real = journal.Journal.checkpoint
    taken: list[int] = []

    async def slow(self):
        taken.append(self.ns.catalog_changes.inode_count)
        await trio.sleep(0.02)
        await real(self)
    monkeypatch.setattr(journal.Journal, "checkpoint", slow)
    run_import(str(tree), str(tmp_path / "pack"))
    # Each inode made changes itself and its directory: at most twice what was made.
    assert len(taken) > 4 and max(taken) <= 2 * (2 * 4 + 1), taken
