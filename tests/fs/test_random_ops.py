"""Random operations from four threads through a real mount, then an unmount, fsck and a
remount: what an ad-hoc run of this kind found on 2026-11-27 (fsck reading a healthy
pack as damaged, MAP_SHARED refused on a creating handle, the writeback cache's times
lost at a remount) stays found.

Each thread keeps files of its own, checked against a model after every few operations
(writes at any offset, appends, truncates, fallocate, mappings, unlinks of open files,
renames and exchanges, copies), and all of them change a shared tree whose outcome
depends on the interleaving (creates, renames and exchanges of directories, links,
rmdirs, listings): there only the errnos the races explain are allowed.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import random
import threading
from pathlib import Path

import pytest

from mounts import mounted, stats

from packfs import fsck

OPS_PER_THREAD = 2500
RENAME_EXCHANGE, RENAME_NOREPLACE = 2, 1
RACES = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EINVAL}  # of the shared tree
_libc = ctypes.CDLL(None, use_errno=True)


def _renameat2(a: Path, b: Path, flags: int) -> None:
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Worker:
    def __init__(self, root: Path, t: int, seed: int, mmap_creating: bool) -> None:
        self.rng = random.Random(seed * 100 + t)
        self.home = root / f"w{t}"
        self.shared = root / "shared"
        self.model: dict[str, bytearray] = {}
        self.fds: dict[str, int] = {}
        self.mmap_creating = mmap_creating
        self.failures: list[str] = []

    def run(self) -> None:
        self.home.mkdir()
        ops = [self.write, self.write, self.append, self.truncate, self.allocate, self.map, self.unlink_open,
               self.rename, self.exchange, self.copy, self.fsync, self.shared_op, self.shared_op]
        try:
            for n in range(OPS_PER_THREAD):
                op = self.rng.choice(ops) if self.model else self.write
                try:
                    op(n)
                except OSError as e:
                    if op != self.shared_op or e.errno not in RACES:
                        self.failures.append(f"{op.__name__}: {e!r}")
                if n % 10 == 0:
                    self.verify()
            self.verify()
        finally:
            for fd in self.fds.values():
                os.close(fd)

    def _fd(self, name: str) -> int:
        if name not in self.fds:
            self.fds[name] = os.open(self.home / name, os.O_RDWR)
        return self.fds[name]

    def _pick(self, n: int) -> str:
        if self.model and self.rng.random() < 0.85:
            return self.rng.choice(list(self.model))
        name = f"p{n}"
        self.fds[name] = os.open(self.home / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # a creating handle
        self.model[name] = bytearray()
        return name

    def write(self, n: int) -> None:
        name = self._pick(n)
        m = self.model[name]
        off = self.rng.randrange(0, len(m) + 10_000)
        data = os.urandom(self.rng.choice([1, 17, 4096, 8193, 150_000]))
        os.pwrite(self._fd(name), data, off)
        m.extend(bytes(max(0, off - len(m))))
        m[off:off + len(data)] = data

    def append(self, n: int) -> None:
        name = self._pick(n)
        data = os.urandom(self.rng.choice([1, 100, 4096, 70_000]))
        os.pwrite(self._fd(name), data, len(self.model[name]))
        self.model[name] += data

    def truncate(self, n: int) -> None:
        name = self._pick(n)
        m = self.model[name]
        size = self.rng.choice([0, len(m) // 2, len(m) + 5000])
        os.ftruncate(self._fd(name), size)
        del m[size:]
        m.extend(bytes(size - len(m)))

    def allocate(self, n: int) -> None:
        name = self._pick(n)
        m = self.model[name]
        size = len(m) + self.rng.choice([1, 4096, 100_000])
        os.posix_fallocate(self._fd(name), 0, size)  # packfs's fallocate grows the file (fuse shim)
        m.extend(bytes(size - len(m)))

    def map(self, n: int) -> None:
        name = self._pick(n)
        m = self.model[name]
        if len(m) < 4096:
            return
        fd = self._fd(name)
        if not self.mmap_creating:
            fd = self.fds[name] = self._reopen(name)
        with mmap.mmap(fd, len(m)) as mapped:
            off = self.rng.randrange(0, len(m) - 100)
            data = os.urandom(100)
            mapped[off:off + 100] = data
            m[off:off + 100] = data
            mapped.flush()

    def _reopen(self, name: str) -> int:
        os.close(self.fds.pop(name))
        return os.open(self.home / name, os.O_RDWR)

    def unlink_open(self, n: int) -> None:
        name = self.rng.choice(list(self.model))
        fd = self.fds.pop(name, None)
        if fd is None:
            fd = os.open(self.home / name, os.O_RDWR)
        try:
            os.unlink(self.home / name)
            data = bytes(self.model.pop(name))
            os.pwrite(fd, b"after", len(data))  # the file lives on while open
            if os.pread(fd, len(data) + 5, 0) != data + b"after":
                self.failures.append(f"unlinked {name} reads back wrong")
        finally:
            os.close(fd)

    def rename(self, n: int) -> None:
        name = self.rng.choice(list(self.model))
        target = self.rng.choice(list(self.model)) if self.rng.random() < 0.3 else f"r{n}"
        os.rename(self.home / name, self.home / target)
        if target != name:
            self.model[target] = self.model.pop(name)
            if target in self.fds:
                os.close(self.fds.pop(target))
            if name in self.fds:
                self.fds[target] = self.fds.pop(name)

    def exchange(self, n: int) -> None:
        if len(self.model) < 2:
            return
        a, b = self.rng.sample(list(self.model), 2)
        _renameat2(self.home / a, self.home / b, RENAME_EXCHANGE)
        self.model[a], self.model[b] = self.model[b], self.model[a]
        fa, fb = self.fds.pop(a, None), self.fds.pop(b, None)
        if fa is not None:
            self.fds[b] = fa
        if fb is not None:
            self.fds[a] = fb

    def copy(self, n: int) -> None:
        src = self.rng.choice(list(self.model))
        dst = f"c{n}"
        s = os.open(self.home / src, os.O_RDONLY)
        d = os.open(self.home / dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            left = len(self.model[src])
            while left:
                k = os.copy_file_range(s, d, left)
                if not k:
                    break
                left -= k
        finally:
            os.close(s)
        self.fds[dst] = d
        self.model[dst] = bytearray(self.model[src])

    def fsync(self, n: int) -> None:
        name = self.rng.choice(list(self.model))
        if name in self.fds:
            os.fsync(self.fds[name])
        d = os.open(self.home, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(d)
        finally:
            os.close(d)

    def shared_op(self, n: int) -> None:
        rng, shared = self.rng, self.shared
        d = shared / f"d{rng.randrange(12)}"
        kind = rng.randrange(5)
        if kind == 0:
            d.mkdir(exist_ok=True)
            fd = os.open(d / f"f{rng.randrange(30)}", os.O_WRONLY | os.O_CREAT | rng.choice([os.O_EXCL, os.O_TRUNC]),
                         0o600)
            try:
                os.write(fd, os.urandom(rng.randrange(0, 9000)))
                os.setxattr(fd, f"user.k{rng.randrange(3)}", os.urandom(rng.randrange(1, 300)))
            finally:
                os.close(fd)
        elif kind == 1:
            b = shared / f"d{rng.randrange(12)}" / f"d{rng.randrange(12)}" if rng.random() < 0.3 else \
                shared / f"d{rng.randrange(12)}"
            _renameat2(d, b, rng.choice([0, 0, RENAME_EXCHANGE, RENAME_NOREPLACE]))
        elif kind == 2:
            os.link(d / f"f{rng.randrange(30)}", shared / f"d{rng.randrange(12)}" / f"h{rng.randrange(30)}")
        elif kind == 3:
            for e in os.scandir(d):
                if e.is_dir(follow_symlinks=False):
                    os.rmdir(e.path)
                else:
                    os.unlink(e.path)
            os.rmdir(d)
        else:
            for p, _, files in os.walk(shared):
                for f in files:
                    os.listxattr(os.path.join(p, f))

    def verify(self) -> None:
        for name, m in self.model.items():
            with open(self.home / name, "rb") as f:
                got = f.read()
            if got != m:
                self.failures.append(f"{name}: {len(got)} bytes read back, {len(m)} written")


def _tree(root: Path) -> dict[str, tuple]:
    """Everything a remount must show the same: per entry its stat fields, contents and xattrs."""
    out = {}
    for p, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(p, name)
            st = os.lstat(path)
            digest = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha1(f.read()).hexdigest()
            xattrs = tuple(sorted((k, os.getxattr(path, k)) for k in os.listxattr(path)))
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_nlink, st.st_size, st.st_mtime_ns,
                                                st.st_ctime_ns, digest, xattrs)
    return out


@pytest.mark.parametrize("options", ["", "writeback_cache,nodirect_writes", "xattrs_in_memory"])
def test_random_operations_read_back_fsck_clean_and_remount_the_same(tmp_path, options):
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    with mounted(pack, mnt, options) as m:
        (m / "shared").mkdir()
        mmap_creating = stats(m)["direct_io_mmap"] or "nodirect_writes" in options
        workers = [Worker(m, t, 1, mmap_creating) for t in range(4)]
        threads = [threading.Thread(target=w.run) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [f for w in workers for f in w.failures] == []
        before = _tree(m)
    lines: list[str] = []
    report = fsck.check(str(pack), out=lines.append)
    assert report.exit_code == 0 and not report.problems, lines[:5]
    with mounted(pack, mnt, options) as m:
        after = _tree(m)
    assert after == before
