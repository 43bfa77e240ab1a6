"""Helpers for the real-mount tests: errno assertions, running code as another user,
tree snapshots, a loop-mounted ext4, steps repeated in threads, renameat2, and
backing-disk usage."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import mmap
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

NOBODY = 65534
T = TypeVar("T")


@contextlib.contextmanager
def raises_errno(expected: int):
    """Assert that the block raises OSError with exactly `expected` errno."""
    try:
        yield
    except OSError as e:
        assert e.errno == expected, (f"expected {errno.errorcode[expected]}, got "
                                     f"{errno.errorcode.get(e.errno, e.errno)}: {e}")
    else:
        raise AssertionError(f"expected OSError {errno.errorcode[expected]}, but the call succeeded")


def as_user(cwd: Path, code: str, uid: int = NOBODY, gid: int = NOBODY, timeout: float = 60) -> Any:
    """Run `code` in a Python subprocess as uid/gid with cwd set to `cwd`.

    The child changes into `cwd` while still root (pytest's tmp directories are 0700, so an
    unprivileged user could not walk to the mount), then drops to uid/gid with no
    supplementary groups. `code` must assign a JSON-serialisable value to `result`.
    A helper `err(fn, *args)` returns the errno name an OSError carries, or "ok".
    """
    prelude = textwrap.dedent("""
        import errno, json, os, sys
        def err(fn, *args, **kw):
            try:
                fn(*args, **kw)
            except OSError as e:
                return errno.errorcode.get(e.errno, str(e.errno))
            return "ok"
        result = None
    """)
    script = prelude + textwrap.dedent(code) + "\nsys.stdout.write(json.dumps(result))\n"

    def drop() -> None:
        os.chdir(cwd)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    proc = subprocess.run([_python_for_others(), "-I", "-c", script], preexec_fn=drop, capture_output=True,
                          text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    assert proc.returncode == 0, f"child failed: {proc.stderr}"
    return json.loads(proc.stdout)


def _world_executable(path: str) -> bool:
    """True if a user with no privileges and no groups can execute path."""
    path = os.path.realpath(path)
    parts = Path(path).parents
    if any(not os.stat(d).st_mode & stat.S_IXOTH for d in parts):
        return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def _python_for_others() -> str:
    """A Python interpreter an unprivileged user can run (the venv's may live under /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    raise RuntimeError("no Python interpreter is executable by an unprivileged user")


def drop_cache(fd: int) -> None:
    """Drop the kernel's cached pages of one file, so the next read asks packfs."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def read_file(path: Path | str, cached: bool = False) -> bytes:
    """A file's whole contents, read from packfs rather than the kernel's page cache."""
    with open(path, "rb") as f:
        if not cached:
            drop_cache(f.fileno())
        return f.read()


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    """The sha256 of a file read from packfs, opened O_NOATIME: reading it leaves its atime."""
    h = hashlib.sha256()
    with open(os.open(path, os.O_RDONLY | os.O_NOATIME), "rb") as f:
        drop_cache(f.fileno())
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_file(path: Path | str, data: bytes, fsync: bool = False, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def snapshot_tree(root: Path) -> dict:
    """Every name under root with its full metadata, xattrs and contents (as sha256).

    Metadata is taken for the whole tree before any file is read, and files are read
    O_NOATIME, so that reading cannot disturb what is compared. The walk's listings do set
    directories' atimes (relatime): a test that compares two snapshots across a clean
    remount, which commits those, mounts noatime. Hard links show as a shared link group.
    """
    meta: dict[str, dict] = {}
    inode_group: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            group = inode_group.setdefault(st.st_ino, rel)
            entry = {
                "type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
                "gid": st.st_gid, "nlink": st.st_nlink, "size": st.st_size, "mtime": st.st_mtime_ns,
                "atime": st.st_atime_ns, "ctime": st.st_ctime_ns, "link_group": group,
                "xattrs": {} if stat.S_ISLNK(st.st_mode) else
                {n: hashlib.sha256(os.getxattr(p, n, follow_symlinks=False)).hexdigest()
                 for n in sorted(os.listxattr(p, follow_symlinks=False))},
            }
            if stat.S_ISLNK(st.st_mode):
                entry["target"] = os.readlink(p)
            meta[rel] = entry
    for rel, entry in meta.items():
        if stat.S_ISREG(entry["type"]):
            entry["sha256"] = sha256_file(root / rel)
    return meta


def backing_usage(packdir: Path) -> int:
    """Bytes the pack directory really occupies on the backing disk (sum of st_blocks)."""
    total = 0
    for dirpath, _, filenames in os.walk(packdir):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def repeat_concurrently(steps: dict[str, Callable[[], None]], seconds: float,
                        enough: Callable[[], bool] = lambda: True, longest: float = 60.0) -> list[str]:
    """Run each step over and over in a thread of its own for `seconds`, and on past them
    until `enough()` holds (a loaded machine does less in the same time), for `longest` at
    most, or until one raises; what was raised, as `name: error`, for the caller to assert on."""
    stop = threading.Event()
    failures: list[str] = []

    def run(name: str, step: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                step()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            failures.append(f"{name}: {e!r}")
            stop.set()

    threads = [threading.Thread(target=run, args=item) for item in steps.items()]
    for t in threads:
        t.start()
    started = time.monotonic()
    stop.wait(seconds)
    while not stop.is_set() and not enough() and time.monotonic() - started < longest:
        stop.wait(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    return failures


# -- renameat2 ---------------------------------------------------------------------------

@contextlib.contextmanager
def loop_ext4(tmp_path: Path, size: int, block_size: int | None = None) -> Iterator[Path]:
    """A freshly made ext4 of `size` bytes, loop-mounted; always unmounted and removed.
    (mkfs.ext4 gives one under 512 MiB blocks of 1 KiB unless told.)"""
    blocks = ["-b", str(block_size)] if block_size else []
    with loop_fs(tmp_path, size, ["mkfs.ext4", "-q", "-F", *blocks]) as backing:
        yield backing


@contextlib.contextmanager
def loop_fs(tmp_path: Path, size: int, mkfs: list[str]) -> Iterator[Path]:
    """A filesystem made by the mkfs command line (`mkfs.TYPE ...`, the image's path
    appended) on an image of `size` bytes, tmp_path/TYPE.img, loop-mounted on a free loop
    device at tmp_path/backing; always unmounted and removed."""
    image, backing = tmp_path / f"{mkfs[0].rsplit('.', 1)[-1]}.img", tmp_path / "backing"
    backing.mkdir()
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(backing)], check=True, capture_output=True)
    try:
        yield backing
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(backing)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(backing)], capture_output=True)
        image.unlink()


RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
RENAME_WHITEOUT = 4
AT_FDCWD = -100

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _libc_error(path: Path | str | None = None) -> OSError:
    """The OSError for the errno a failed libc call left."""
    e = ctypes.get_errno()
    return OSError(e, os.strerror(e)) if path is None else OSError(e, os.strerror(e), str(path))


FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE = 0x01, 0x02, 0x10  # linux/falloc.h
AT_SYMLINK_FOLLOW = 0x400


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    fn: Callable = _libc.fallocate
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if fn(fd, mode, offset, length) != 0:
        raise _libc_error()


def pages_reclaimed() -> int:
    """Pages the kernel has reclaimed since boot, in any cgroup (/proc/vmstat)."""
    with open("/proc/vmstat") as f:
        return sum(int(v) for k, v in (line.split() for line in f) if k in ("pgsteal_anon", "pgsteal_file"))


def without_reclaim(measure: Callable[[int], T], tries: int = 5) -> T:
    """measure(try) again until the kernel reclaimed no memory while it ran, for a test
    counting the requests a kernel cache spares: a page of that cache that reclaim takes
    is asked for again, which is no fault of the cache (see pages_pinned for the file
    pages a test can pin). The last try's result if reclaim ran through each of them."""
    for attempt in range(tries):
        reclaimed = pages_reclaimed()
        result = measure(attempt)
        if pages_reclaimed() == reclaimed:
            break
    return result


@contextlib.contextmanager
def pages_pinned(fd: int, length: int) -> Iterator[None]:
    """Hold a file's first `length` bytes of page cache in memory (mmap and mlock), so
    that a test counting READ requests sees the kernel's cache policy, not its reclaim:
    under memory pressure a clean cached page may go at any time. An invalidation
    (truncate_pagecache, invalidate_inode_pages2) still drops pinned pages."""
    mmap_: Callable = _libc.mmap
    mmap_.restype, mmap_.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                      ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = mmap_(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise _libc_error()
    try:
        _libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if _libc.mlock(addr, length) != 0:
            raise _libc_error()
        yield
    finally:
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.munmap(addr, length)


def model_pwrite(model: bytearray, offset: int, data: bytes) -> None:
    """What pwrite(2) does to a file, done to the bytearray that stands for it."""
    if offset > len(model):
        model.extend(bytes(offset - len(model)))
    model[offset:offset + len(data)] = data


def link_fd(fd: int, new: Path | str) -> None:
    """Name an open file (an O_TMPFILE one too) as Swift does: linkat of /proc/self/fd/N,
    following it (os.link would link the /proc symlink itself: EXDEV)."""
    fn: Callable = _libc.linkat
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    if fn(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, os.fsencode(new), AT_SYMLINK_FOLLOW) != 0:
        raise _libc_error(new)


def renameat2(old: Path | str, new: Path | str, flags: int) -> None:
    fn: Callable = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        raise _libc_error(old)
