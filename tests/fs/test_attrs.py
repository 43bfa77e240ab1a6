"""chmod, chown, utimens with nanoseconds, and extended attributes."""
from __future__ import annotations

import errno
import os
import stat
import time

import pytest

from fsutil import raises_errno, write_file
from mounts import mounted

KiB = 1024


def test_chmod(work):
    write_file(work / "f", b"")
    os.makedirs(work / "d")
    for mode in (0o000, 0o4755, 0o2711, 0o1777, 0o640):
        os.chmod(work / "f", mode)
        assert stat.S_IMODE(os.stat(work / "f").st_mode) == mode
        assert stat.S_ISREG(os.stat(work / "f").st_mode)
    os.chmod(work / "d", 0o700)
    st = os.stat(work / "d")
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700


def test_chmod_changes_ctime_not_mtime(work):
    write_file(work / "f", b"")
    os.utime(work / "f", ns=(5, 5))
    before = os.stat(work / "f")
    os.chmod(work / "f", 0o600)
    after = os.stat(work / "f")
    assert after.st_mtime_ns == 5 and after.st_atime_ns == 5
    assert after.st_ctime_ns > before.st_ctime_ns


def test_chown(work):
    write_file(work / "f", b"")
    os.chown(work / "f", 1234, 5678)
    st = os.stat(work / "f")
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.chown(work / "f", -1, 42)
    st = os.stat(work / "f")
    assert (st.st_uid, st.st_gid) == (1234, 42)
    os.symlink("f", work / "l")
    os.lchown(work / "l", 77, 88)
    assert (os.lstat(work / "l").st_uid, os.lstat(work / "l").st_gid) == (77, 88)
    assert os.stat(work / "f").st_uid == 1234


@pytest.mark.parametrize("options", ["", "writeback_cache,nodirect_writes"])
def test_a_chown_to_the_same_owner_changes_ctime_and_takes_set_id_bits(tmp_path, options):
    """As any chown on Linux (XFS, ext4), from root too. FUSE sends a chown to -1:-1 with no
    attribute at all (with the writeback cache, with the kernel's ctime alone). The
    set-group-ID bit goes only with group execute permission (without, it marks
    mandatory locking)."""
    with mounted(tmp_path / "pack", tmp_path / "mnt", options) as m:
        for name, mode, left in [("f", 0o6755, 0o755), ("g", 0o6744, 0o2744), ("d", 0o3755, 0o3755)]:
            if name == "d":
                os.mkdir(m / name)
            else:
                write_file(m / name, b"")
            os.chmod(m / name, mode)
            before = os.stat(m / name).st_ctime_ns
            time.sleep(0.005)
            os.chown(m / name, -1, -1)
            st = os.stat(m / name)
            assert st.st_ctime_ns > before, name
            assert stat.S_IMODE(st.st_mode) == left, (name, oct(st.st_mode))


def test_chown_clears_setuid_setgid(work):
    write_file(work / "f", b"")
    os.chmod(work / "f", 0o6755)
    os.chown(work / "f", 1000, 1000)
    assert stat.S_IMODE(os.stat(work / "f").st_mode) == 0o755


def test_utimens_nanoseconds(work):
    write_file(work / "f", b"x")
    atime, mtime = 1_234_567_890_123_456_789, 1_600_000_000_987_654_321
    os.utime(work / "f", ns=(atime, mtime))
    st = os.stat(work / "f")
    assert st.st_atime_ns == atime
    assert st.st_mtime_ns == mtime
    # Before the epoch and far future, as Swift's X-Timestamp allows.
    os.utime(work / "f", ns=(0, 4_102_444_800_000_000_001))
    st = os.stat(work / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (0, 4_102_444_800_000_000_001)


def test_utime_now_and_dirs_and_symlinks(work):
    os.makedirs(work / "d")
    os.utime(work / "d", ns=(111, 222))
    st = os.stat(work / "d")
    assert (st.st_atime_ns, st.st_mtime_ns) == (111, 222)
    os.utime(work / "d")  # now
    assert os.stat(work / "d").st_mtime_ns > 10**18
    os.symlink("d", work / "l")
    os.utime(work / "l", ns=(333, 444), follow_symlinks=False)
    assert os.lstat(work / "l").st_mtime_ns == 444
    assert os.stat(work / "d").st_mtime_ns != 444


def test_write_updates_mtime_and_size(work):
    write_file(work / "f", b"")
    os.utime(work / "f", ns=(1, 1))
    with open(work / "f", "ab") as f:
        f.write(b"abc")
    st = os.stat(work / "f")
    assert st.st_size == 3 and st.st_mtime_ns > 1


@pytest.mark.parametrize("options", ["", "writeback_cache,nodirect_writes"])
def test_the_times_stat_shows_are_the_times_the_next_mount_shows(tmp_path, options):
    """With the writeback cache the kernel keeps a file's mtime and ctime and sends them
    when it flushes them; the WRITE of its pages comes later. Setting the daemon's own
    time on that WRITE left files (written, then an xattr set, or truncated and
    rewritten) with times ms apart from what stat had shown, once remounted."""
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    shown = {}
    with mounted(pack, mnt, options) as m:
        write_file(m / "c", b"old")
        for name, flags, xattr in [("a", os.O_CREAT | os.O_EXCL, False), ("b", os.O_CREAT | os.O_EXCL, True),
                                   ("c", os.O_CREAT | os.O_TRUNC, False), ("c", os.O_CREAT | os.O_TRUNC, True)]:
            fd = os.open(m / name, os.O_WRONLY | flags, 0o600)
            try:
                os.write(fd, b"x" * 5000)
                if xattr:
                    os.setxattr(fd, "user.k", b"v")
            finally:
                os.close(fd)
            time.sleep(0.005)  # (the daemon's clock moves on from the kernel's)
            st = os.stat(m / name)
            shown[name] = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    with mounted(pack, mnt, options) as m:
        for name, times in shown.items():
            st = os.stat(m / name)
            assert (st.st_mtime_ns, st.st_ctime_ns, st.st_size) == times, name


@pytest.mark.parametrize("options", ["", "writeback_cache,nodirect_writes", "nofilecache"])
def test_truncates_change_the_times_and_a_remount_shows_the_times_stat_showed(tmp_path, options):
    """An O_TRUNC open and an ftruncate change mtime and ctime even when the size stays,
    as on XFS and ext4 (with nofilecache, an O_TRUNC open is an OPEN request). With the writeback cache the kernel sends no times for a
    truncate(2) to the size it knows, and the daemon's own had shown after a remount."""
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    shown = {}
    with mounted(pack, mnt, options) as m:
        for size in (0, 5000):
            for how in ("truncate", "O_TRUNC", "ftruncate"):
                name = f"{how}-{size}"
                write_file(m / name, b"x" * size)
                os.utime(m / name, ns=(1_000_000_001, 2_000_000_002))
                time.sleep(0.005)
                if how == "truncate":
                    os.truncate(m / name, size)
                else:
                    fd = os.open(m / name, os.O_WRONLY | (os.O_TRUNC if how == "O_TRUNC" else 0))
                    try:
                        if how == "ftruncate":
                            os.ftruncate(fd, size)
                    finally:
                        os.close(fd)
                st = os.stat(m / name)
                if how != "truncate":
                    assert st.st_mtime_ns > 2_000_000_002, name
                shown[name] = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    with mounted(pack, mnt, options) as m:
        for name, times in shown.items():
            st = os.stat(m / name)
            assert (st.st_mtime_ns, st.st_ctime_ns, st.st_size) == times, name


def test_create_unlink_update_parent_mtime(work):
    os.utime(work, ns=(1, 1))
    write_file(work / "f", b"")
    assert os.stat(work).st_mtime_ns > 1
    os.utime(work, ns=(1, 1))
    os.unlink(work / "f")
    assert os.stat(work).st_mtime_ns > 1


# -- extended attributes -------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4 * KiB, 64 * KiB - 1, 64 * KiB])
def test_xattr_value_sizes(work, size):
    write_file(work / "f", b"")
    value = os.urandom(size)
    os.setxattr(work / "f", "user.swift.metadata", value)
    assert os.getxattr(work / "f", "user.swift.metadata") == value
    assert os.listxattr(work / "f") == ["user.swift.metadata"]


def test_xattr_over_64k_is_e2big(work):
    write_file(work / "f", b"")
    with raises_errno(errno.E2BIG):
        os.setxattr(work / "f", "user.big", b"x" * (64 * KiB + 1))
    assert os.listxattr(work / "f") == []


def test_xattr_100_per_file(work):
    write_file(work / "f", b"")
    values = {f"user.swift.metadata{i or ''}": os.urandom(1000 + i) for i in range(100)}
    fd = os.open(work / "f", os.O_RDWR)
    try:
        for name, value in values.items():
            os.setxattr(fd, name, value)  # fsetxattr, as Swift does
        os.fsync(fd)
    finally:
        os.close(fd)
    assert sorted(os.listxattr(work / "f")) == sorted(values)
    for name, value in values.items():
        assert os.getxattr(work / "f", name) == value


def test_xattr_several_64k_values(work):
    write_file(work / "f", b"")
    values = {f"user.swift.metadata{i or ''}": bytes([i]) * (64 * KiB) for i in range(8)}
    for name, value in values.items():
        os.setxattr(work / "f", name, value)
    for name, value in values.items():
        assert os.getxattr(work / "f", name) == value


def test_xattr_replace_and_remove(work):
    write_file(work / "f", b"")
    os.setxattr(work / "f", "user.a", b"1")
    os.setxattr(work / "f", "user.a", b"22")
    assert os.getxattr(work / "f", "user.a") == b"22"
    os.removexattr(work / "f", "user.a")
    with raises_errno(errno.ENODATA):
        os.getxattr(work / "f", "user.a")
    with raises_errno(errno.ENODATA):
        os.removexattr(work / "f", "user.a")
    with raises_errno(errno.ENODATA):
        os.getxattr(work / "f", "user.never")
    assert os.listxattr(work / "f") == []


def test_xattr_create_and_replace_flags(work):
    write_file(work / "f", b"")
    os.setxattr(work / "f", "user.x", b"1", os.XATTR_CREATE)
    with raises_errno(errno.EEXIST):
        os.setxattr(work / "f", "user.x", b"2", os.XATTR_CREATE)
    with raises_errno(errno.ENODATA):
        os.setxattr(work / "f", "user.y", b"2", os.XATTR_REPLACE)
    os.setxattr(work / "f", "user.x", b"3", os.XATTR_REPLACE)
    assert os.getxattr(work / "f", "user.x") == b"3"


def test_xattr_on_directories(work):
    os.makedirs(work / "d")
    os.setxattr(work / "d", "user.dirmeta", b"v" * 5000)
    assert os.getxattr(work / "d", "user.dirmeta") == b"v" * 5000
    assert os.listxattr(work / "d") == ["user.dirmeta"]
    os.removexattr(work / "d", "user.dirmeta")
    assert os.listxattr(work / "d") == []


def test_xattr_shared_by_hardlinks_and_kept_by_rename(work):
    write_file(work / "f", b"")
    os.setxattr(work / "f", "user.k", b"v")
    os.link(work / "f", work / "g")
    assert os.getxattr(work / "g", "user.k") == b"v"
    os.rename(work / "f", work / "h")
    assert os.getxattr(work / "h", "user.k") == b"v"


def test_xattr_changes_ctime(work):
    write_file(work / "f", b"")
    before = os.stat(work / "f").st_ctime_ns
    os.setxattr(work / "f", "user.k", b"v")
    assert os.stat(work / "f").st_ctime_ns > before


def test_xattr_binary_and_long_names(work):
    write_file(work / "f", b"")
    name = "user." + "n" * 250  # 255 bytes: XATTR_NAME_MAX
    os.setxattr(work / "f", name, b"\x00\xff\x00")
    assert os.getxattr(work / "f", name) == b"\x00\xff\x00"
    with raises_errno(errno.ERANGE):
        os.setxattr(work / "f", "user." + "n" * 251, b"")


def test_xattr_names_outside_the_namespaces_xfs_keeps_are_refused(work):
    """As on XFS and ext4, so that whatever packfs holds can be copied to them."""
    write_file(work / "f", b"")
    for name in ("bogus.k", "system.k", "k", "userk"):
        with raises_errno(errno.EOPNOTSUPP):
            os.setxattr(work / "f", name, b"v")
    for name in ("user.", "trusted.", "security."):
        with raises_errno(errno.EINVAL):
            os.setxattr(work / "f", name, b"v")
    os.setxattr(work / "f", "trusted.k", b"t")
    os.setxattr(work / "f", "security.k", b"s")
    assert sorted(os.listxattr(work / "f")) == ["security.k", "trusted.k"]
    for _ in range(2):  # from packfs, then from the fuse shim, which has the file's xattrs by now
        assert os.getxattr(work / "f", "trusted.k") == b"t"
        with raises_errno(errno.ENODATA):
            os.getxattr(work / "f", "user.absent")
        for name, refused in [("bogus.k", errno.EOPNOTSUPP), ("user.", errno.EINVAL)]:
            with raises_errno(refused):
                os.getxattr(work / "f", name)
            with raises_errno(refused):
                os.removexattr(work / "f", name)
            with raises_errno(refused):
                os.setxattr(work / "f", name, b"v", os.XATTR_REPLACE)


def test_security_capability_absent(work):
    """The kernel asks for it on every write; it must be a cheap ENODATA."""
    write_file(work / "f", b"")
    with raises_errno(errno.ENODATA):
        os.getxattr(work / "f", "security.capability")



def test_xattrs_read_back_from_the_catalog_after_a_checkpoint(tmp_path):
    """noxattrs_in_memory: a checkpoint drops xattr values from the daemon's memory; they
    are read from the catalog, changed, and checkpointed again."""
    from mounts import mounted

    from packfs.fuse import control
    from packfs.core import pack

    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrs_in_memory") as work:
        pack_id = pack.read_marker(str(tmp_path / "pack"))["pack_id"]
        held = lambda: control.request(pack_id, "stats")["xattr_values_in_memory"]  # noqa: E731
        values = {i: os.urandom(40) * (i + 1) for i in range(50)}
        for i, v in values.items():
            write_file(work / f"f{i}", b"")
            os.setxattr(work / f"f{i}", "user.swift.metadata", v)
        os.setxattr(work / "f0", "user.second", b"2")
        assert held() >= len(values)
        assert control.request(pack_id, "sync") == {"ok": True}
        assert held() == 0
        for i, v in values.items():
            assert os.getxattr(work / f"f{i}", "user.swift.metadata") == v
        assert sorted(os.listxattr(work / "f0")) == ["user.second", "user.swift.metadata"]
        os.setxattr(work / "f1", "user.swift.metadata", b"changed")
        os.removexattr(work / "f0", "user.second")
        assert held() == 2
        assert control.request(pack_id, "sync") == {"ok": True}
        assert held() == 0
        assert os.getxattr(work / "f1", "user.swift.metadata") == b"changed"
        assert os.listxattr(work / "f0") == ["user.swift.metadata"]
        assert os.listxattr(work / "f2") == ["user.swift.metadata"]
    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrs_in_memory") as work:
        assert control.request(pack_id, "stats")["xattr_values_in_memory"] == 0  # the mount loaded none
        assert os.getxattr(work / "f1", "user.swift.metadata") == b"changed"
        assert os.getxattr(work / "f49", "user.swift.metadata") == values[49]
    with mounted(tmp_path / "pack", tmp_path / "mnt", "xattrs_in_memory") as work:  # loads them all
        assert control.request(pack_id, "stats")["xattr_values_in_memory"] == len(values)
        assert os.getxattr(work / "f49", "user.swift.metadata") == values[49]


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def test_swift_objects_xattrs_are_read_from_their_records(tmp_path):
    """noxattrs_in_memory: an object written as Swift writes it (data, fsetxattr, fsync)
    carries its metadata in its record; after a checkpoint the daemon holds none of it,
    and a cold read (page cache dropped, then after a remount) gives it back with the
    data, through the FUSE shim's handlers and packfs's alike."""
    from mounts import mounted

    from packfs.fuse import control
    from packfs.core import pack

    values = {i: os.urandom(60 + i) for i in range(40)}
    data = {i: os.urandom(100 * i) for i in values}

    def check(work) -> None:
        for i, v in values.items():
            assert os.getxattr(work / f"o{i}", "user.swift.metadata") == v
            assert os.listxattr(work / f"o{i}") == ["user.swift.metadata"]
            assert (work / f"o{i}").read_bytes() == data[i]

    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrs_in_memory") as work:
        pack_id = pack.read_marker(str(tmp_path / "pack"))["pack_id"]
        stats = lambda: control.request(pack_id, "stats")  # noqa: E731
        for i, v in values.items():
            fd = os.open(work / f"o{i}", os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                os.write(fd, data[i])
                os.setxattr(fd, "user.swift.metadata", v)
                os.fsync(fd)
            finally:
                os.close(fd)
        assert control.request(pack_id, "sync") == {"ok": True}
        s = stats()
        # o0 has no data, so no record: the catalog keeps its value
        assert (s["xattr_values_in_memory"], s["xattr_values_in_records"]) == (0, len(values) - 1)
        _drop_caches()
        check(work)
    for options in ("noxattrs_in_memory", "noxattrs_in_memory,nometacache", "xattrs_in_memory"):
        with mounted(tmp_path / "pack", tmp_path / "mnt", options) as work:
            _drop_caches()
            check(work)
            assert stats()["xattr_values_in_records"] == len(values) - 1
