"""rename of files and directories, with the errnos ext4 gives, and renameat2 flags."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from fsutil import RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT, raises_errno, read_file, renameat2, write_file


def test_rename_file_atomic_replace(work):
    write_file(work / "tmp", b"new contents", fsync=True)
    write_file(work / "target", b"old contents that are longer", fsync=True)
    new_ino = os.stat(work / "tmp").st_ino
    os.rename(work / "tmp", work / "target")
    assert not (work / "tmp").exists()
    assert os.stat(work / "target").st_ino == new_ino
    assert os.stat(work / "target").st_nlink == 1
    assert read_file(work / "target") == b"new contents"
    assert sorted(os.listdir(work)) == ["target"]


def test_rename_replace_keeps_open_target_readable(work):
    write_file(work / "target", b"old", fsync=True)
    write_file(work / "tmp", b"new")
    fd = os.open(work / "target", os.O_RDONLY)
    try:
        os.rename(work / "tmp", work / "target")
        assert os.fstat(fd).st_nlink == 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, 100, 0) == b"old"
    finally:
        os.close(fd)
    assert read_file(work / "target") == b"new"


def test_rename_across_directories(work):
    os.makedirs(work / "a")
    os.makedirs(work / "b")
    write_file(work / "a" / "f", b"payload")
    ino = os.stat(work / "a" / "f").st_ino
    os.rename(work / "a" / "f", work / "b" / "g")
    assert os.listdir(work / "a") == []
    assert os.listdir(work / "b") == ["g"]
    assert os.stat(work / "b" / "g").st_ino == ino
    assert read_file(work / "b" / "g") == b"payload"
    # File link counts are unchanged; directory link counts do not move for files.
    assert os.stat(work / "b" / "g").st_nlink == 1
    assert os.stat(work / "a").st_nlink == 2 and os.stat(work / "b").st_nlink == 2


def test_rename_directory_across_parents_updates_link_counts(work):
    os.makedirs(work / "src" / "moving" / "inner")
    write_file(work / "src" / "moving" / "inner" / "f", b"deep")
    os.makedirs(work / "dst")
    assert os.stat(work / "src").st_nlink == 3
    os.rename(work / "src" / "moving", work / "dst" / "moved")
    assert os.stat(work / "src").st_nlink == 2
    assert os.stat(work / "dst").st_nlink == 3
    assert os.stat(work / "dst" / "moved").st_nlink == 3
    assert os.stat(work / "dst" / "moved" / "..").st_ino == os.stat(work / "dst").st_ino
    assert read_file(work / "dst" / "moved" / "inner" / "f") == b"deep"
    # The moved directory can be removed afterwards and the counts come back.
    os.unlink(work / "dst" / "moved" / "inner" / "f")
    os.rmdir(work / "dst" / "moved" / "inner")
    os.rmdir(work / "dst" / "moved")
    assert os.stat(work / "dst").st_nlink == 2


def test_rename_dir_over_empty_dir(work):
    os.makedirs(work / "a" / "child")
    os.makedirs(work / "b")
    assert os.stat(work).st_nlink == 4
    a_ino = os.stat(work / "a").st_ino
    os.rename(work / "a", work / "b")
    assert sorted(os.listdir(work)) == ["b"]
    assert os.stat(work / "b").st_ino == a_ino
    assert os.listdir(work / "b") == ["child"]
    assert os.stat(work).st_nlink == 3


def test_rename_dir_into_own_subdir_is_einval(work):
    os.makedirs(work / "a" / "b" / "c")
    with raises_errno(errno.EINVAL):
        os.rename(work / "a", work / "a" / "b" / "c" / "a")
    with raises_errno(errno.EINVAL):
        os.rename(work / "a", work / "a" / "b" / "x")
    assert os.path.isdir(work / "a" / "b" / "c")


def test_rename_dir_over_nonempty_dir_is_enotempty(work):
    os.makedirs(work / "a")
    os.makedirs(work / "b" / "inside")
    with raises_errno(errno.ENOTEMPTY):
        os.rename(work / "a", work / "b")
    write_file(work / "c", b"")
    os.makedirs(work / "d")
    write_file(work / "d" / "file", b"")
    with raises_errno(errno.ENOTEMPTY):
        os.rename(work / "a", work / "d")
    assert os.path.isdir(work / "a") and os.path.isdir(work / "b" / "inside")


def test_rename_file_over_dir_is_eisdir(work):
    write_file(work / "f", b"")
    os.makedirs(work / "d")
    with raises_errno(errno.EISDIR):
        os.rename(work / "f", work / "d")
    assert os.path.isfile(work / "f") and os.path.isdir(work / "d")


def test_rename_dir_over_file_is_enotdir(work):
    os.makedirs(work / "d")
    write_file(work / "f", b"x")
    with raises_errno(errno.ENOTDIR):
        os.rename(work / "d", work / "f")
    assert read_file(work / "f") == b"x"


def test_rename_missing_source_is_enoent(work):
    with raises_errno(errno.ENOENT):
        os.rename(work / "missing", work / "x")
    os.makedirs(work / "d")
    with raises_errno(errno.ENOENT):
        os.rename(work / "d", work / "nodir" / "x")


def test_rename_hardlinks_of_same_inode_is_noop(work):
    write_file(work / "a", b"same")
    os.link(work / "a", work / "b")
    os.rename(work / "a", work / "b")
    assert sorted(os.listdir(work)) == ["a", "b"]
    assert os.stat(work / "a").st_nlink == 2


def test_rename_to_itself(work):
    write_file(work / "a", b"x")
    os.rename(work / "a", work / "a")
    assert read_file(work / "a") == b"x"


def test_rename_replace_hardlinked_target_decrements_nlink(work):
    write_file(work / "t", b"target")
    os.link(work / "t", work / "t2")
    write_file(work / "s", b"source")
    os.rename(work / "s", work / "t")
    assert os.stat(work / "t2").st_nlink == 1
    assert read_file(work / "t2") == b"target"
    assert read_file(work / "t") == b"source"


def test_swift_style_mkstemp_rename_loop(work):
    """Many tmp-file + rename commits into one name (a Swift PUT overwriting an object).

    A concurrent reader (a GET) must always open either the old or the new file: the
    name never disappears, and the file it names is never a mixture.
    """
    os.makedirs(work / "tmp")
    os.makedirs(work / "objects")
    final = work / "objects" / "obj.data"
    write_file(final, b"v0" * 1000)
    stop = threading.Event()
    bad: list[bytes] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                fd = os.open(final, os.O_RDONLY)
            except OSError as e:
                bad.append(f"open({final.name}) -> {errno.errorcode.get(e.errno)}".encode())
                continue
            try:
                data = os.read(fd, 10_000)
            except OSError as e:
                bad.append(f"read -> {errno.errorcode.get(e.errno)}".encode())
                continue
            finally:
                os.close(fd)
            if len(set(data[i:i + 2] for i in range(0, len(data), 2))) != 1 or len(data) != 2000:
                bad.append(data[:20])

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 200):
            tmp = work / "tmp" / f".tmp{i}"
            write_file(tmp, (b"%02d" % (i % 100)) * 1000, fsync=True)
            os.rename(tmp, final)
    finally:
        stop.set()
        t.join()
    assert not bad, f"{len(bad)} reads of a name being renamed over failed or saw a mixture: {bad[:3]}"
    assert read_file(final) == b"%02d" % (199 % 100) * 1000
    assert os.listdir(work / "tmp") == []


def test_renameat2_noreplace(work):
    write_file(work / "a", b"a")
    write_file(work / "b", b"b")
    with raises_errno(errno.EEXIST):
        renameat2(work / "a", work / "b", RENAME_NOREPLACE)
    assert read_file(work / "b") == b"b"
    renameat2(work / "a", work / "c", RENAME_NOREPLACE)
    assert sorted(os.listdir(work)) == ["b", "c"]


def test_renameat2_whiteout_is_refused(work):
    """packfs makes no whiteouts: RENAME_WHITEOUT fails with EINVAL and moves nothing,
    rather than moving the file and leaving no whiteout behind."""
    write_file(work / "a", b"a")
    with raises_errno(errno.EINVAL):
        renameat2(work / "a", work / "b", RENAME_WHITEOUT)
    with raises_errno(errno.EINVAL):
        renameat2(work / "a", work / "b", RENAME_WHITEOUT | RENAME_NOREPLACE)
    assert os.listdir(work) == ["a"] and read_file(work / "a") == b"a"


def test_renameat2_exchange_files(work):
    write_file(work / "a", b"AAA")
    write_file(work / "b", b"BB")
    ia, ib = os.stat(work / "a").st_ino, os.stat(work / "b").st_ino
    renameat2(work / "a", work / "b", RENAME_EXCHANGE)
    assert read_file(work / "a") == b"BB" and read_file(work / "b") == b"AAA"
    assert os.stat(work / "a").st_ino == ib and os.stat(work / "b").st_ino == ia
    with raises_errno(errno.ENOENT):
        renameat2(work / "a", work / "missing", RENAME_EXCHANGE)


def test_renameat2_exchange_dir_and_file_across_dirs(work):
    os.makedirs(work / "p1" / "dir" / "x")
    os.makedirs(work / "p2")
    write_file(work / "p2" / "file", b"f")
    assert os.stat(work / "p1").st_nlink == 3 and os.stat(work / "p2").st_nlink == 2
    renameat2(work / "p1" / "dir", work / "p2" / "file", RENAME_EXCHANGE)
    assert os.path.isfile(work / "p1" / "dir") and os.path.isdir(work / "p2" / "file" / "x")
    assert os.stat(work / "p1").st_nlink == 2 and os.stat(work / "p2").st_nlink == 3
    assert os.stat(work / "p2" / "file" / "..").st_ino == os.stat(work / "p2").st_ino


@pytest.mark.parametrize("flags", [RENAME_NOREPLACE | RENAME_EXCHANGE])
def test_renameat2_both_flags_einval(work, flags):
    write_file(work / "a", b"")
    write_file(work / "b", b"")
    with raises_errno(errno.EINVAL):
        renameat2(work / "a", work / "b", flags)
