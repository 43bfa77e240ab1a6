"""A source tree with every kind of file `packfs import` must keep, and ways to read one
back as comparable records (for the import's unit and mount tests).

Run as root: device nodes, owners other than the caller's and trusted.* xattrs need it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import random
import socket
import stat
from pathlib import Path

MiB = 1 << 20
NAME_MAX = 255
T0 = 1_600_000_000_123_456_789  # times with nanoseconds


def swift_metadata(name: str, size: int, extra: int = 0) -> list[tuple[str, bytes]]:
    """The xattrs Swift's object server writes for an object: its metadata pickled as
    Swift pickles it (protocol 2, bytes keys and values), split into 64 KiB pieces
    (user.swift.metadata, user.swift.metadata1, ...), and the pickle's MD5."""
    meta = {b"name": name.encode(), b"X-Timestamp": b"1700000000.12345", b"Content-Type": b"application/octet-stream",
            b"ETag": hashlib.md5(name.encode()).hexdigest().encode(), b"Content-Length": str(size).encode(),
            b"X-Object-Meta-Color": b"blue", b"X-Object-Sysmeta-Ec-Frag-Index": b"3"}
    if extra:
        meta[b"X-Object-Meta-Big"] = b"b" * extra
    pickled = pickle.dumps(meta, protocol=2)
    pieces = [pickled[i:i + 65536] for i in range(0, len(pickled), 65536)]
    return [(f"user.swift.metadata{i or ''}", p) for i, p in enumerate(pieces)] + \
        [("user.swift.metadata_checksum", hashlib.md5(pickled).hexdigest().encode())]


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # (the umask)


def _sparse(path: Path, runs: list[tuple[int, bytes]], size: int) -> None:
    with open(path, "wb") as f:
        for offset, data in runs:
            f.seek(offset)
            f.write(data)
        f.truncate(size)


def build(root: Path, big_xattrs: bool = True, deep: int = 40) -> None:
    """Make the tree under root (which must not exist). big_xattrs: values of 64 KiB and
    Swift's metadata split in two (XFS takes them; ext4 only with ea_inode)."""
    rng = random.Random(56)
    root.mkdir()
    objects = root / "objects" / "1023" / "abc" / ("0" * 29 + "abc")
    objects.mkdir(parents=True)
    data = rng.randbytes(64)
    _write(objects / "1700000000.12345.data", data)
    for name, value in swift_metadata("/AUTH_test/c/o", 64):
        os.setxattr(objects / "1700000000.12345.data", name, value)
    if big_xattrs:
        _write(root / "split-metadata", b"x")
        for name, value in swift_metadata("/AUTH_test/c/big", 1, extra=70_000):
            os.setxattr(root / "split-metadata", name, value)
        _write(root / "big-xattr", b"v")
        os.setxattr(root / "big-xattr", "user.big", rng.randbytes(65536))
    _write(root / "empty", b"")
    _write(root / "empty-with-xattr", b"")
    os.setxattr(root / "empty-with-xattr", "user.note", b"")
    os.setxattr(root / "empty-with-xattr", "trusted.t", b"\0\1\2")
    _write(root / "medium", rng.randbytes(100_000))
    _write(root / "large", rng.randbytes(3 * MiB + 7))  # four records of 1 MiB at most
    # Sparse: holes in the middle and at the end; a hole first; nothing but a hole.
    _sparse(root / "sparse", [(0, rng.randbytes(4096)), (5 * MiB, rng.randbytes(8192))], 6 * MiB)
    _sparse(root / "sparse-head", [(2 * MiB, b"tail")], 2 * MiB + 4)
    _sparse(root / "all-hole", [], 3 * MiB)
    # Hard links across directories, of a file and of an empty file.
    (root / "a").mkdir()
    (root / "b" / "c").mkdir(parents=True)
    _write(root / "a" / "linked", rng.randbytes(5000))
    os.link(root / "a" / "linked", root / "b" / "linked-too")
    os.link(root / "a" / "linked", root / "b" / "c" / "third name")
    os.link(root / "empty", root / "b" / "empty-link")
    # Symlinks: relative, dangling, to a directory, owned by another.
    os.symlink("../a/linked", root / "b" / "rel")
    os.symlink("/nowhere/at/all", root / "dangling")
    os.symlink("b/c", root / "dirlink")
    os.lchown(root / "dangling", 3000, 4000)
    os.setxattr(root / "dangling", "trusted.on-a-symlink", b"yes", follow_symlinks=False)
    # Special files.
    os.mknod(root / "fifo", stat.S_IFIFO | 0o640)
    os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(root / "blockdev", stat.S_IFBLK | 0o600, os.makedev(8, 17))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "socket"))
    # Names: not UTF-8, a newline, a space, the longest.
    for name in (b"caf\xe9", b"\xff\xfe-raw", b"new\nline", b"with space", b"n" * NAME_MAX):
        _write(Path(os.fsdecode(bytes(root) + b"/" + name)), name)
    # A deep path.
    deep_dir = root / "deep"
    for i in range(deep):
        deep_dir = deep_dir / f"level-{i:02d}-{'d' * 20}"
    deep_dir.mkdir(parents=True)
    _write(deep_dir / "leaf", b"deep down")
    # Empty directories, modes, owners.
    (root / "empty-dir").mkdir(mode=0o700)
    (root / "sticky").mkdir()
    os.chmod(root / "sticky", 0o1777)
    _write(root / "setuid", b"#!/bin/sh\n", 0o4755)
    _write(root / "setgid", b"#!/bin/sh\n", 0o2750)
    _write(root / "no-rights", b"secret", 0o000)
    _write(root / "owned", b"theirs")
    os.chown(root / "owned", 1000, 2000)
    os.chown(root / "setuid", 1000, 1000)
    os.chmod(root / "setuid", 0o4755)  # (the chown took the bit)
    # A set-group-ID directory hands its group and bit to what is made in it: the
    # import must give its entries the source's own, even where they differ.
    shared = root / "shared"
    shared.mkdir()
    os.chown(shared, 5000, 6000)
    os.chmod(shared, 0o2775)
    _write(shared / "other-group", b"g")
    os.chown(shared / "other-group", 5000, 7000)
    (shared / "no-setgid").mkdir()
    os.chown(shared / "no-setgid", 5000, 6000)
    os.chmod(shared / "no-setgid", 0o755)
    os.setxattr(shared, "user.on-a-directory", b"dir")
    os.setxattr(shared, "trusted.dir", b"t")
    # Times with nanoseconds, directories' last (their entries changed them).
    for i, (dirpath, dirnames, filenames) in enumerate(os.walk(root)):
        for j, name in enumerate(sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))])):
            p = os.path.join(dirpath, name)
            os.utime(p, ns=(T0 - 7 * 10**9 + i * 1_000_003 + j, T0 + i * 999_999 + j), follow_symlinks=False)
    for i, (dirpath, _, _) in enumerate(sorted(os.walk(root), key=lambda w: -len(w[0]))):
        os.utime(dirpath, ns=(T0 - 3 * 10**9 + i * 7, T0 - 10**9 + i * 11))


def records(root: Path) -> dict[bytes, dict]:
    """Every path under root (root itself as b"."), by lstat alone (which changes nothing):
    type, mode, owner, size, link count, device, times, blocks, link target, xattrs, a hash
    of the contents, and `group`, the first (sorted) of the names that share its inode."""
    out: dict[bytes, dict] = {}
    names: dict[int, list[bytes]] = {}
    base = bytes(root)
    todo = [base]
    out[b"."] = _record(base, names, b".")
    while todo:
        d = todo.pop()
        for e in os.scandir(d):
            p = os.path.join(d, e.name)
            rel = os.path.relpath(p, base)
            out[rel] = _record(p, names, rel)
            if e.is_dir(follow_symlinks=False):
                todo.append(p)
    for r in out.values():
        r["group"] = min(names[r.pop("ino")])
    return out


def _record(path: bytes, names: dict[int, list[bytes]], rel: bytes) -> dict:
    st = os.lstat(path)
    names.setdefault(st.st_ino, []).append(rel)
    r = {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
         "nlink": st.st_nlink, "rdev": st.st_rdev, "atime": st.st_atime_ns, "mtime": st.st_mtime_ns,
         "ctime": st.st_ctime_ns, "ino": st.st_ino, "blocks": st.st_blocks,
         "size": 0 if stat.S_ISDIR(st.st_mode) else st.st_size,
         "xattrs": {n: os.getxattr(path, n, follow_symlinks=False)
                    for n in sorted(os.listxattr(path, follow_symlinks=False))}}
    if stat.S_ISLNK(st.st_mode):
        r["target"] = os.readlink(path)
    if stat.S_ISREG(st.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NOATIME)
        try:
            h = hashlib.sha256()
            while chunk := os.read(fd, MiB):
                h.update(chunk)
            r["sha256"] = h.hexdigest()
        finally:
            os.close(fd)
    return r
