"""statvfs, fsync and fsyncdir, NAME_MAX and PATH_MAX, and hostile xattr values."""
from __future__ import annotations

import errno
import os
import time

import pytest

from fsutil import fsync_dir, raises_errno, read_file, write_file
from mounts import daemon_pid, mounted, stats

from packfs.fuse import control
from packfs.core import pack


def test_statvfs_reflects_backing_disk(shared_mount, work):
    packdir, m = shared_mount
    ours, backing = os.statvfs(m), os.statvfs(packdir)
    avail, real = ours.f_bavail * ours.f_frsize, backing.f_bavail * backing.f_frsize
    assert abs(avail - real) <= 0.03 * real, (avail, real)
    total, real_total = ours.f_blocks * ours.f_frsize, backing.f_blocks * backing.f_frsize
    assert abs(total - real_total) <= 0.03 * real_total
    assert ours.f_bfree >= ours.f_bavail
    assert ours.f_namemax == 255
    assert ours.f_files > 0 and 0 < ours.f_ffree <= ours.f_files


def test_statvfs_counts_inodes(work):
    before = os.statvfs(work)
    for i in range(50):
        write_file(work / f"f{i}", b"")
    after = os.statvfs(work)
    assert after.f_files - after.f_ffree >= before.f_files - before.f_ffree + 50


def test_fsync_fdatasync_fsyncdir_succeed(work):
    fd = os.open(work / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x" * 100_000)
        os.fsync(fd)
        os.write(fd, b"y")
        os.fdatasync(fd)
        os.fsync(fd)  # nothing new: still fine
    finally:
        os.close(fd)
    fsync_dir(work)
    fsync_dir(work.parent)
    fd = os.open(work / "f", os.O_RDONLY)  # fsync of a read-only fd is allowed
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.sync()


def test_name_255_ok_256_enametoolong(work):
    name255, name256 = "n" * 255, "n" * 256
    write_file(work / name255, b"ok")
    assert read_file(work / name255) == b"ok"
    assert name255 in os.listdir(work)
    os.mkdir(work / ("d" * 255))
    os.symlink("x", work / ("s" * 255))
    with raises_errno(errno.ENAMETOOLONG):
        os.open(work / name256, os.O_CREAT | os.O_WRONLY, 0o644)
    with raises_errno(errno.ENAMETOOLONG):
        os.mkdir(work / ("d" * 256))
    with raises_errno(errno.ENAMETOOLONG):
        os.symlink("x", work / ("s" * 256))
    with raises_errno(errno.ENAMETOOLONG):
        os.link(work / name255, work / name256)
    with raises_errno(errno.ENAMETOOLONG):
        os.rename(work / name255, work / name256)
    assert read_file(work / name255) == b"ok"
    # Multi-byte UTF-8: the limit is 255 bytes, not characters.
    write_file(work / ("é" * 127), b"")  # 254 bytes
    with raises_errno(errno.ENAMETOOLONG):
        write_file(work / ("é" * 128), b"")  # 256 bytes


def test_lookup_of_256_byte_name_is_enametoolong(work):
    """ext4 and XFS refuse an over-long name at lookup, so stat says ENAMETOOLONG, not ENOENT."""
    with raises_errno(errno.ENAMETOOLONG):
        os.stat(work / ("n" * 256))


def test_deep_nesting_path_max(work):
    """Paths up to PATH_MAX (4096 with the NUL) resolve; one byte more is ENAMETOOLONG."""
    base = os.fsencode(work)
    comp = b"d" * 200
    path = base
    depth = 0
    while len(path) + 1 + len(comp) < 4000:
        path = path + b"/" + comp
        os.mkdir(path)
        depth += 1
    assert depth >= 15
    # Pad the last component so that the file's path is exactly 4095 bytes long.
    last = b"f" * (4095 - len(path) - 1)
    assert len(last) <= 255
    full = path + b"/" + last
    assert len(full) == 4095
    write_file(full, b"deep")
    assert read_file(full) == b"deep"
    assert os.stat(full).st_size == 4
    with raises_errno(errno.ENAMETOOLONG):
        os.stat(full + b"x")


def test_tree_deeper_than_path_max_via_dirfds(work):
    """A tree may be deeper than PATH_MAX; it is reached component by component."""
    fds = [os.open(work, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for _ in range(40):  # 40 * 201 bytes, about 8 KiB of path
            os.mkdir("x" * 200, dir_fd=fds[-1])
            fds.append(os.open("x" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        fd = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fds[-1])
        os.write(fd, b"leaf data")
        os.fsync(fd)
        os.close(fd)
        fd = os.open("leaf", os.O_RDONLY, dir_fd=fds[-1])
        assert os.read(fd, 100) == b"leaf data"
        os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    def fail(e: OSError) -> None:
        raise e
    found = [(len(root), files) for root, _, files, _ in os.fwalk(work, onerror=fail) if files]
    assert len(found) == 1 and found[0][1] == ["leaf"] and found[0][0] > 8000


@pytest.mark.parametrize("name", ["with space", "tab\there", "new\nline", "ünïcødé", ".hidden", "..dots", "-dash"])
def test_unusual_names(work, name):
    write_file(work / name, name.encode())
    assert name in os.listdir(work)
    assert read_file(work / name) == name.encode()


def test_non_utf8_name(work):
    name = os.fsencode(work) + b"/bad\xff\xfename"
    write_file(name, b"x")
    assert b"bad\xff\xfename" in os.listdir(os.fsencode(work))


def test_a_hostile_swift_metadata_value_is_kept_and_costs_the_daemon_nothing(packdir, mnt):
    """Any user who may write a file may set its `user.swift.metadata`, and the daemon
    reads that value as a pickle when it compresses it (at a checkpoint here). A memo
    index of 2^26 made pickle's Unpickler fill a 1 GiB table; a call of `bytes` or of a
    codec is refused the same way. Each value reads back as it was set."""
    values = [
        b"\x80\x02}r\xff\xff\xff\x03.",
        b"\x80\x04Nr\xff\xff\xff\x030N.",
        b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x40\x85R.",
        b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00abX\x03\x00\x00\x00hex\x86R.",
    ]
    for i, value in enumerate(values):
        write_file(mnt / f"o{i}", b"x")
        os.setxattr(mnt / f"o{i}", "user.swift.metadata", value + b"\0" * 200)
    pid = daemon_pid(packdir)
    assert control.request(pack.read_marker(str(packdir))["pack_id"], "sync") == {"ok": True}
    with open(f"/proc/{pid}/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    assert peak_kib < 512 << 10, f"the daemon's RSS peaked at {peak_kib >> 10} MiB"
    for i, value in enumerate(values):
        assert os.getxattr(mnt / f"o{i}", "user.swift.metadata") == value + b"\0" * 200


def test_xattr_churn_without_a_commit_does_not_grow_the_daemon(tmp_path):
    """The arena's compaction comes due on the free that makes it so, not at the next
    commit: checked only after commits, a minute of setxattrs without an fsync took the
    daemon's RSS past 1.1 GiB. Here no commit comes at all (commit_interval=0, no fsync)
    while 800 MiB of values of ever other sizes replace each other on 40 files (each
    file's xattrs past 64 KiB together: they go to the arena as they are)."""
    import random
    rng = random.Random(12)
    with mounted(tmp_path / "pack", tmp_path / "mnt", "commit_interval=0") as m:
        pid = daemon_pid(tmp_path / "pack")
        files = [m / f"x{i}" for i in range(40)]
        for f in files:
            write_file(f, b"x")
            os.setxattr(f, "user.a", b"a" * 40_000)
        values: dict = {}
        for _ in range(800 * 2**20 // 85_000):
            f = rng.choice(files)
            values[f] = rng.randbytes(rng.randrange(30_000, 60_000))
            os.setxattr(f, "user.v", values[f])
        with open(f"/proc/{pid}/status") as st:
            peak_kib = next(int(line.split()[1]) for line in st if line.startswith("VmHWM:"))
        assert stats(m)["commits"] == 0  # (nothing but the churn could have started a compaction)
        assert peak_kib < 200 << 10, f"the daemon's RSS peaked at {peak_kib >> 10} MiB"
        assert "xattr arena compacted" in (tmp_path / "pack" / "packfs.log").read_text()
        for f, value in values.items():
            assert os.getxattr(f, "user.v") == value


def test_xattr_values_of_ever_new_sizes_do_not_grow_the_daemon_for_ever(packdir, mnt):
    """Every replaced value frees a run of the xattr arena that only a value of its size
    reuses. 100 MiB of xattrs of random sizes past 64 KiB (they go to the arena as they
    are) on 40 files: the daemon compacts the arena once the free space outweighs the
    values (and 64 MiB), instead of holding it all."""
    import random
    rng = random.Random(11)
    files = [mnt / f"x{i}" for i in range(40)]
    for f in files:
        write_file(f, b"x")
        os.setxattr(f, "user.a", b"a" * 40_000)
    values: dict = {}
    freed = 0
    while freed < 100 << 20:
        f = rng.choice(files)
        freed += 40_000 + len(values.get(f, b""))
        values[f] = rng.randbytes(rng.randrange(30_000, 60_000))
        os.setxattr(f, "user.v", values[f])
    fd = os.open(files[0], os.O_RDONLY)
    try:
        os.fsync(fd)  # a commit: the compressor's turn, and its check of the arena after it
    finally:
        os.close(fd)
    deadline = time.monotonic() + 30
    while "xattr arena compacted" not in (packdir / "packfs.log").read_text():
        assert time.monotonic() < deadline, stats(mnt)["arena_free_bytes"]
        time.sleep(0.1)
    s = stats(mnt)
    assert s["arena_free_bytes"]["xattrs"] < 64 << 20 and s["arena_bytes"]["xattrs"] < 80 << 20, s["arena_bytes"]
    for f, value in values.items():
        assert os.getxattr(f, "user.v") == value
