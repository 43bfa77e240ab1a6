"""kill -9 of the daemon while writers fsync: every acknowledged file survives intact.

Writers work through directory fds opened on the mount before the crash, so after the
daemon dies they get ENOTCONN and can never write into the bare mount point below.
"""
from __future__ import annotations

import errno
import hashlib
import os
import random
import subprocess
import threading
import time
import traceback
from typing import Callable

import pytest

from fsutil import read_file, write_file
from mounts import PACKFS, daemon_pid, is_mounted, kill9, mounted, stats

KiB = 1 << 10


def content(name: str) -> bytes:
    rnd = random.Random(name)
    return rnd.randbytes(rnd.choice([0, 1, 4 * KiB, 64 * KiB, 200 * KiB + 3, 1100 * KiB]))


def log_size(packdir) -> int:
    return (packdir / "packfs.log").stat().st_size


def log_since(packdir, size: int) -> bytes:
    """What the daemon logged after `size` bytes of its log."""
    with open(packdir / "packfs.log", "rb") as f:
        f.seek(size)
        return f.read()


def failure() -> str:
    """The exception being handled, with where it was raised and when (to compare with the kill)."""
    return f"at {time.monotonic():.3f}: {traceback.format_exc()}"


class Workers:
    """n threads running `run(i)` in the mount (through root_fd) until the block ends; once
    the daemon has died they must all have returned, with no error but the dead mount's.

    The dead mount's errors are ENOTCONN and ECONNABORTED, and EIO for a request the
    kernel was handing to the daemon as it was killed: fuse_dev_do_read (fs/fuse/dev.c)
    ends a request whose copy into the reader's buffer fails with EIO. So an EIO raised
    after the kill is the crash's, if the daemon logged no error (packfs logs every
    cause of an EIO it answers); any other error, or an EIO before the kill, fails the
    test."""

    def __init__(self, root_fd: int, tag: str, n: int) -> None:
        self.root_fd = root_fd
        self.tag = tag
        self.errors: list[tuple[float, int, str]] = []  # (time.monotonic(), errno, traceback)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]

    def __enter__(self) -> "Workers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "a worker hung after the daemon died"

    def run(self, i: int) -> None:
        raise NotImplementedError

    def died(self, e: OSError) -> None:
        if e.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            self.errors.append((time.monotonic(), e.errno, failure()))

    @property
    def unexpected(self) -> list[str]:
        """The errors so far; before the kill, any error is unexpected."""
        return [tb for _, _, tb in self.errors]

    def unexpected_after(self, killed_at: float, log: bytes) -> list[str]:
        """The errors the crash does not explain, given the daemon's log of the round."""
        crash = [tb for when, err, tb in self.errors if err == errno.EIO and when >= killed_at]
        if crash and b" ERROR " in log:
            return self.unexpected + [log.decode(errors="replace")[-2000:]]
        return [tb for tb in self.unexpected if tb not in crash]


class Writers(Workers):
    """Threads writing files and fsyncing file then directory, as a Swift PUT does."""

    def __init__(self, root_fd: int, tag: str, n: int = 8) -> None:
        super().__init__(root_fd, tag, n)
        self.acked: set[str] = set()
        self.started: set[str] = set()
        self.lock = threading.Lock()

    def run(self, i: int) -> None:
        dname = f"{self.tag}-w{i}"
        try:
            os.mkdir(dname, dir_fd=self.root_fd)
            dfd = os.open(dname, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root_fd)
            os.fsync(dfd)
            os.fsync(self.root_fd)
        except OSError as e:
            self.died(e)
            return
        try:
            k = 0
            while not self.stop.is_set():
                name = f"{dname}/f{k}"
                data = content(name)
                with self.lock:
                    self.started.add(name)
                fd = os.open(f"f{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=dfd)
                try:
                    for pos in range(0, len(data), 64 * KiB):
                        os.write(fd, data[pos:pos + 64 * KiB])
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.fsync(dfd)
                with self.lock:
                    self.acked.add(name)
                k += 1
        except OSError as e:
            self.died(e)
        finally:
            os.close(dfd)


def test_kill9_while_writers_fsync(tmp_path, packdir):
    mnt = tmp_path / "mnt"
    acked: set[str] = set()
    started: set[str] = set()
    rnd = random.Random(99)
    for rnd_round in range(3):
        with mounted(packdir, mnt):
            logged = log_size(packdir)
            # Everything acknowledged in earlier rounds is still there and intact.
            for name in sorted(acked):
                assert read_file(mnt / name) == content(name), f"round {rnd_round}: {name} lost or damaged"
            root_fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with Writers(root_fd, f"r{rnd_round}") as w:
                    deadline = time.monotonic() + 30
                    while len(w.acked) < 20 and time.monotonic() < deadline and not w.unexpected:
                        time.sleep(0.05)
                    time.sleep(rnd.uniform(0.1, 1.0))
                    pid = daemon_pid(packdir)
                    killed_at = time.monotonic()
                    kill9(packdir, mnt)
                    assert not is_mounted(mnt)
                    assert daemon_pid(packdir) in (pid, None)
            finally:
                os.close(root_fd)
            unexpected = w.unexpected_after(killed_at, log_since(packdir, logged))
            assert not unexpected, (f"killed at {killed_at:.3f}", *unexpected[:3])
            assert len(w.acked) >= 20, "writers made too little progress before the crash"
            acked |= w.acked
            started |= w.started
        # The mount point is clean: nothing was written into it while the mount was dead.
        assert not is_mounted(mnt)
        assert os.listdir(mnt) == []
    with mounted(packdir, mnt):
        for name in sorted(acked):
            got = read_file(mnt / name)
            want = content(name)
            assert got == want, (f"{name}: fsync returned but after kill -9 it reads {len(got)} bytes "
                                 f"(sha {hashlib.sha256(got).hexdigest()[:12]}), expected {len(want)}")
        # Files whose fsync never returned may be missing, but are never garbage: each reads
        # as a state it passed through, i.e. a prefix of what was being written.
        for name in sorted(started - acked):
            try:
                got = read_file(mnt / name)
            except FileNotFoundError:
                continue
            assert content(name).startswith(got), f"{name}: unacknowledged file reads as garbage"
        # And the filesystem is usable: new writes work and persist.
        (mnt / "after").write_bytes(b"alive")
    with mounted(packdir, mnt):
        assert read_file(mnt / "after") == b"alive"


def version(key: str, v: int) -> bytes:
    rnd = random.Random(f"{key}:{v}")
    return (b"v%d:" % v) + rnd.randbytes(rnd.choice([10, 5000, 70 * KiB, 300 * KiB]))


class Committers(Workers):
    """Threads doing Swift's commit: write a temp file, fsync, rename over the object, fsync
    the directory; and deleting older objects with unlink + fsync of the directory."""

    def __init__(self, root_fd: int, tag: str, n: int = 6) -> None:
        super().__init__(root_fd, tag, n)
        self.acked: dict[str, int] = {}      # object -> last version whose commit returned
        self.attempted: dict[str, int] = {}  # object -> last version whose rename was issued
        self.deleted: set[str] = set()       # names whose unlink + fsync(dir) returned

    def run(self, i: int) -> None:
        dname = f"{self.tag}-c{i}"
        key = f"{dname}/obj.data"
        dfd = -1
        try:
            os.mkdir(dname, dir_fd=self.root_fd)
            dfd = os.open(dname, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root_fd)
            os.fsync(self.root_fd)
            v = 0
            while not self.stop.is_set():
                v += 1
                tmp = f".tmp{v}"
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=dfd)
                try:
                    os.write(fd, version(key, v))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self.attempted[key] = v
                os.rename(tmp, "obj.data", src_dir_fd=dfd, dst_dir_fd=dfd)
                os.fsync(dfd)
                self.acked[key] = v
                # A short-lived file, removed durably.
                junk = f"junk{v}"
                fd = os.open(junk, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd)
                os.write(fd, b"junk")
                os.fsync(fd)
                os.close(fd)
                os.unlink(junk, dir_fd=dfd)
                os.fsync(dfd)
                self.deleted.add(f"{dname}/{junk}")
        except OSError as e:
            self.died(e)
        finally:
            if dfd >= 0:
                os.close(dfd)


def test_kill9_during_rename_commits(tmp_path, packdir):
    """After a crash, a renamed-over object is the old or the new version, never neither or a
    mixture; renames and unlinks made durable by fsync(dir) are kept."""
    mnt = tmp_path / "mnt"
    for rnd_round in range(2):
        with mounted(packdir, mnt):
            logged = log_size(packdir)
            root_fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with Committers(root_fd, f"r{rnd_round}") as c:
                    deadline = time.monotonic() + 30
                    while sum(c.acked.values()) < 60 and time.monotonic() < deadline and not c.unexpected:
                        time.sleep(0.05)
                    time.sleep(random.Random(rnd_round).uniform(0.05, 0.5))
                    killed_at = time.monotonic()
                    kill9(packdir, mnt)
            finally:
                os.close(root_fd)
            unexpected = c.unexpected_after(killed_at, log_since(packdir, logged))
            assert not unexpected, (f"killed at {killed_at:.3f}", *unexpected[:3])
            assert sum(c.acked.values()) >= 60
        assert os.listdir(mnt) == []
        with mounted(packdir, mnt):
            for key, acked in c.acked.items():
                data = read_file(mnt / key)
                v = int(data.split(b":", 1)[0][1:])
                assert acked <= v <= c.attempted[key], f"{key}: version {v}, acknowledged {acked}"
                assert data == version(key, v), f"{key}: version {v} is damaged"
            for name in c.deleted:
                assert not (mnt / name).exists(), f"{name} was unlinked durably but came back"


@pytest.mark.parametrize("options", ["", "xattrs_in_memory"])
def test_kill9_keeps_fsynced_metadata(tmp_path, packdir, options):
    """fsync(file) makes data, size, attributes and xattrs durable; fsync(dir) the names.
    A checkpoint comes between two halves of the changes, so recovery reads some from the
    catalog (with noxattrs_in_memory, xattr values too) and replays the others."""
    from fsutil import fsync_dir, snapshot_tree
    from test_bulk import _build_tree

    from packfs.fuse import control
    from packfs.core import pack

    mnt = tmp_path / "mnt"
    with mounted(packdir, mnt, options):
        _build_tree(mnt)
        assert control.request(pack.read_marker(str(packdir))["pack_id"], "sync") == {"ok": True}
        for i, p in enumerate(sorted((mnt / "objects").glob("f*.data"))):
            if i % 3 == 0:
                os.setxattr(p, "user.swift.metadata", b"changed after the checkpoint %d" % i)
            elif i % 3 == 1:
                os.removexattr(p, "user.swift.metadata")
        # Make everything durable the way an application must: fsync every file and directory.
        for dirpath, dirnames, filenames in os.walk(mnt):
            for name in filenames:
                p = os.path.join(dirpath, name)
                if os.path.isfile(p) and not os.path.islink(p):
                    fd = os.open(p, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            fsync_dir(dirpath)
        before = snapshot_tree(mnt)
        kill9(packdir, mnt)
    assert os.listdir(mnt) == []
    with mounted(packdir, mnt, options):
        after = snapshot_tree(mnt)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], name


def _stat_when(mnt, key: str, done: Callable[[int], bool], timeout: float) -> int:
    """The mount's `key` statistic once `done` says so, or as it is after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not done(n := stats(mnt)[key]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def _commits_after(mnt, since: int, timeout: float) -> int:
    return _stat_when(mnt, "commits", lambda n: n > since, timeout)


def test_kill9_keeps_what_the_commit_interval_committed(tmp_path, packdir):
    """Files nobody fsyncs (rsync's replication, an operator's copy) are committed once
    `commit_interval` has passed, so the daemon's death loses at most that much; with
    commit_interval=0 no commit comes without an fsync."""
    mnt = tmp_path / "mnt"
    files = {f"objects/7/a3f/{i:032x}/1700000000.{i:05d}.data": content(f"unsynced-{i}") for i in range(20)}
    with mounted(packdir, mnt, "commit_interval=0.5"):
        mounted_commits = stats(mnt)["commits"]
        for rel, data in files.items():
            (mnt / rel).parent.mkdir(parents=True, exist_ok=True)
            write_file(mnt / rel, data)  # no fsync, of the file or of any directory
        # The interval's commit may come while the files are still being written (a slow
        # machine), so count from the mount and wait until it has taken every change.
        assert _commits_after(mnt, mounted_commits, timeout=30) > mounted_commits, "no commit came within 30 s"
        assert _stat_when(mnt, "uncommitted_inodes", lambda n: n == 0, timeout=30) == 0, \
            "changes still uncommitted 30 s after the writes"
        time.sleep(0.5)  # the last commit's flush (its count goes up when it is queued)
        kill9(packdir, mnt)
    with mounted(packdir, mnt, "commit_interval=0"):
        for rel, data in files.items():
            assert read_file(mnt / rel) == data, f"{rel}: written, committed by the interval, lost by kill -9"
        (mnt / "later").write_bytes(b"x" * 5000)
        idle = stats(mnt)["commits"]
        assert _commits_after(mnt, idle, timeout=2.0) == idle, "commit_interval=0 still committed on a timer"
        s = stats(mnt)
        assert s["uncommitted_inodes"] >= 2  # the file and its directory
        assert s["seconds_since_commit"] is None or s["seconds_since_commit"] >= 2.0  # none in this mount, or not since
        shown = subprocess.run([*PACKFS, "stats", str(mnt)], check=True, capture_output=True, text=True).stdout
        assert f"{s['uncommitted_inodes']:>12,}   inodes changed since the last commit" in shown, shown


@pytest.mark.parametrize("options", ["commit_interval=0", "commit_interval=0,nofilecache"])
def test_kill9_keeps_o_sync_writes(tmp_path, packdir, options):
    """A write(2) to a file opened O_SYNC or O_DSYNC is durable when it returns, with no
    fsync: such a handle never gets direct I/O, whose writes the kernel follows with no
    FSYNC (a new file's handle and, with nofilecache, a write-only one had it)."""
    mnt = tmp_path / "mnt"
    cases = {"new-sync": os.O_CREAT | os.O_WRONLY | os.O_SYNC, "new-dsync": os.O_CREAT | os.O_WRONLY | os.O_DSYNC,
             "old-sync": os.O_WRONLY | os.O_SYNC, "old-rdwr-dsync": os.O_RDWR | os.O_DSYNC}
    with mounted(packdir, mnt, options):
        for name in cases:
            if name.startswith("old"):
                write_file(mnt / name, b"", fsync=True)
        for name, flags in cases.items():  # each checked alone: any commit makes every change durable
            fd = os.open(mnt / name, flags, 0o644)
            try:
                os.write(fd, content(name) or b"x")
                assert stats(mnt)["uncommitted_inodes"] == 0, f"{name}: write returned uncommitted"
            finally:
                os.close(fd)
        kill9(packdir, mnt)
    with mounted(packdir, mnt, options):
        for name in cases:
            assert read_file(mnt / name) == (content(name) or b"x"), f"{name}: an O_SYNC write lost by kill -9"


@pytest.mark.parametrize("options", ["", "writeback_cache,nodirect_writes"])
def test_kill9_keeps_every_committed_sqlite_transaction(tmp_path, packdir, options):
    """A database written in place, as Swift's container servers write theirs (a rollback
    journal): after kill -9 it is intact, holds every transaction that committed, and no
    part of any other. Its pages are rewritten all over, so its extent map grows past the
    length a commit journals as edits (format 5). synchronous=EXTRA, since a transaction
    commits when its journal is unlinked, and only EXTRA has SQLite fsync the directory
    then: with FULL, the last transaction may come back rolled back on any filesystem.

    Only a COMMIT that returned before the kill was sent must survive. SQLite skips the
    directory's fsync when it cannot open the directory, and reports the COMMIT done: a
    kill that lands between the journal's unlink and that open (strace of one such run:
    unlink returns 0 after the SIGKILL, the directory's open fails with ENOTCONN, the
    COMMIT returns) leaves a transaction that no fsync made durable, on any filesystem
    whose server dies under a living application. It may survive or not, whole."""
    import sqlite3

    mnt = tmp_path / "mnt"
    batch = 40
    committed: list[int] = []
    errors: list[BaseException] = []
    with mounted(packdir, mnt, options):
        db = sqlite3.connect(str(mnt / "c.db"), isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode = DELETE")
        db.execute("PRAGMA synchronous = EXTRA")
        db.execute("CREATE TABLE object (name TEXT PRIMARY KEY, batch INTEGER, body BLOB)")
        rnd = random.Random(3)
        db.execute("BEGIN")
        for i in range(20_000):
            db.execute("INSERT INTO object VALUES (?, -1, ?)", ("%032x" % rnd.getrandbits(128), rnd.randbytes(40)))
        db.execute("COMMIT")
        killed = threading.Event()

        def writer() -> None:
            try:
                n = 0
                while not killed.is_set():
                    db.execute("BEGIN")
                    for _ in range(batch):
                        db.execute("INSERT INTO object VALUES (?, ?, ?)",
                                   ("%032x" % rnd.getrandbits(128), n, rnd.randbytes(40)))
                    db.execute("COMMIT")
                    committed.append(n)
                    n += 1
            except sqlite3.OperationalError as e:
                if not killed.is_set():  # else the dead mount's ("disk I/O error")
                    errors.append(e)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        deadline = time.monotonic() + 60
        while len(committed) < 30 and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.05)
        killed.set()
        returned = len(committed)  # COMMITs that returned before the kill is sent
        kill9(packdir, mnt)
        t.join(30)
        db.close()
    assert not errors and not t.is_alive(), errors
    assert returned >= 30, "the writer committed too little before the kill"
    with mounted(packdir, mnt, options):
        db = sqlite3.connect(str(mnt / "c.db"))
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            counts = dict(db.execute("SELECT batch, count(*) FROM object GROUP BY batch"))
        finally:
            db.close()
    assert counts.pop(-1) == 20_000
    assert set(committed[:returned]) <= set(counts), "a transaction that committed was lost"
    assert set(counts.values()) == {batch}, "a transaction survived in part"
    assert sorted(counts) == list(range(len(counts)))  # what survived is a prefix of the history
