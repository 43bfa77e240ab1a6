"""create and O_EXCL, modes under umask, ownership, and permission checks for other users.

The mount has allow_other and default_permissions (as root), so the kernel checks modes
against the uid, gid and mode packfs reports, exactly as on ext4.
"""
from __future__ import annotations

import errno
import os
import stat

import pytest

from fsutil import NOBODY, as_user, raises_errno


def test_create_excl_and_eexist(work, umask022):
    p = work / "f"
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    os.close(fd)
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o644  # 0666 & ~022
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert st.st_size == 0 and st.st_nlink == 1
    with raises_errno(errno.EEXIST):
        os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    # O_CREAT without O_EXCL opens the existing file and leaves its mode alone.
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644


@pytest.mark.parametrize("umask,mode,expected", [
    (0o022, 0o666, 0o644), (0o077, 0o666, 0o600), (0o000, 0o640, 0o640), (0o027, 0o777, 0o750),
])
def test_create_mode_respects_umask(work, umask, mode, expected):
    old = os.umask(umask)
    try:
        os.close(os.open(work / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
        os.mkdir(work / "d", mode)
        os.mknod(work / "fifo", stat.S_IFIFO | mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(work / "f").st_mode) == expected
    assert stat.S_IMODE(os.stat(work / "d").st_mode) == expected
    st = os.stat(work / "fifo")
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == expected


def test_excl_on_existing_dir_and_symlink(work):
    os.mkdir(work / "d")
    os.symlink("nowhere", work / "l")
    with raises_errno(errno.EEXIST):
        os.open(work / "d", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    # O_EXCL never follows a symlink, even a dangling one.
    with raises_errno(errno.EEXIST):
        os.open(work / "l", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    assert not os.path.lexists(work / "nowhere")


def test_open_missing_without_creat_is_enoent(work):
    with raises_errno(errno.ENOENT):
        os.open(work / "missing", os.O_RDONLY)
    with raises_errno(errno.ENOENT):
        os.open(work / "nodir" / "f", os.O_CREAT | os.O_WRONLY, 0o644)


def test_nonroot_creates_with_its_own_uid_gid(work):
    os.chmod(work, 0o777)
    result = as_user(work, """
        os.umask(0o022)
        fd = os.open("mine", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        os.write(fd, b"x")
        os.close(fd)
        os.mkdir("mydir", 0o777)
        st, sd = os.stat("mine"), os.stat("mydir")
        result = [st.st_uid, st.st_gid, st.st_mode & 0o7777, sd.st_uid, sd.st_gid, sd.st_mode & 0o7777]
    """)
    assert result == [NOBODY, NOBODY, 0o644, NOBODY, NOBODY, 0o755]
    # Root sees the same ownership.
    st = os.stat(work / "mine")
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)


def test_nonroot_eacces_in_root_owned_0755_dir(work):
    os.chmod(work, 0o755)
    (work / "existing").write_bytes(b"data")
    os.chmod(work / "existing", 0o644)
    result = as_user(work, """
        result = {
            "create": err(os.open, "new", os.O_CREAT | os.O_WRONLY, 0o644),
            "mkdir": err(os.mkdir, "newdir"),
            "unlink": err(os.unlink, "existing"),
            "rename": err(os.rename, "existing", "renamed"),
            "symlink": err(os.symlink, "existing", "sl"),
            "write_existing": err(os.open, "existing", os.O_WRONLY),
            "read_existing": err(lambda: os.close(os.open("existing", os.O_RDONLY))),
        }
    """)
    assert result == {"create": "EACCES", "mkdir": "EACCES", "unlink": "EACCES", "rename": "EACCES",
                      "symlink": "EACCES", "write_existing": "EACCES", "read_existing": "ok"}
    assert sorted(os.listdir(work)) == ["existing"]


def test_nonroot_eacces_reading_0600_root_file(work):
    (work / "secret").write_bytes(b"root only")
    os.chmod(work / "secret", 0o600)
    os.mkdir(work / "private", 0o700)
    (work / "private" / "f").write_bytes(b"x")
    result = as_user(work, """
        result = {
            "read": err(os.open, "secret", os.O_RDONLY),
            "stat": err(os.stat, "secret"),
            "list_private": err(os.listdir, "private"),
            "stat_in_private": err(os.stat, "private/f"),
        }
    """)
    assert result == {"read": "EACCES", "stat": "ok", "list_private": "EACCES", "stat_in_private": "EACCES"}


def test_chown_by_nonroot_is_eperm(work):
    os.chmod(work, 0o777)
    (work / "rootfile").write_bytes(b"r")
    result = as_user(work, """
        fd = os.open("own", os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        result = {
            "give_own_to_root": err(os.chown, "own", 0, -1),
            "chgrp_own_to_root": err(os.chown, "own", -1, 0),
            "chown_root_file": err(os.chown, "rootfile", 65534, 65534),
            "chmod_root_file": err(os.chmod, "rootfile", 0o777),
            "chmod_own": err(os.chmod, "own", 0o600),
            "utime_root_file": err(os.utime, "rootfile", (1, 1)),
        }
    """)
    assert result == {"give_own_to_root": "EPERM", "chgrp_own_to_root": "EPERM", "chown_root_file": "EPERM",
                      "chmod_root_file": "EPERM", "chmod_own": "ok", "utime_root_file": "EPERM"}
    st = os.stat(work / "own")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o600)
    assert os.stat(work / "rootfile").st_uid == 0


def test_sticky_dir_protects_other_users_files(work):
    os.chmod(work, 0o1777)
    (work / "rootfile").write_bytes(b"r")
    result = as_user(work, """
        result = {"unlink": err(os.unlink, "rootfile"), "rename": err(os.rename, "rootfile", "x")}
    """)
    assert result == {"unlink": "EPERM", "rename": "EPERM"}
    assert (work / "rootfile").exists()


def test_setgid_directory_inherits_group(work):
    os.chmod(work, 0o777)
    os.chown(work, 0, 4242)
    os.chmod(work, 0o2777)
    os.mkdir(work / "sub")
    (work / "f").write_bytes(b"")
    assert os.stat(work / "f").st_gid == 4242
    sd = os.stat(work / "sub")
    assert sd.st_gid == 4242 and sd.st_mode & stat.S_ISGID
