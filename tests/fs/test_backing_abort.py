"""The backing filesystem fails under a mount: ext4 aborted (`mount -o remount,abort`,
what ext4 does itself on metadata errors with errors=remount-ro) answers EROFS to every
write. packfs must fail with EIO the write that met it and every change after it (the
pack is read-only until remounted), go on serving what it has, unmount cleanly, and
lose nothing fsync'd: once the disk is
mounted again, the pack mounts, fsck finds it clean, and only what no fsync
acknowledged is gone (README, durability contract)."""
from __future__ import annotations

import errno
import os
import subprocess

from fsutil import fsync_dir, loop_ext4, raises_errno, read_file, write_file
from mounts import mounted, stats

from packfs import fsck

MiB = 1 << 20


def test_an_aborted_backing_filesystem_fails_writes_and_loses_nothing_fsynced(tmp_path):
    with loop_ext4(tmp_path, 200 * MiB) as backing:
        pack, mnt = backing / "pack", tmp_path / "mnt"
        with mounted(pack, mnt) as m:
            write_file(m / "kept", b"k" * 10_000, fsync=True)
            fsync_dir(m)
            subprocess.run(["mount", "-o", "remount,abort", str(backing)], check=True)
            with raises_errno(errno.EIO):
                write_file(m / "lost", b"l" * 10_000, fsync=True)
            # (Its create may have come before the log met the error, and show till the unmount.)
            tree = sorted(os.listdir(m))
            # The pack is read-only now: no change shows that no commit could hold.
            changes = [lambda: write_file(m / "kept", b"x"), lambda: os.unlink(m / "kept"),
                       lambda: os.rename(m / "kept", m / "moved"), lambda: os.mkdir(m / "d"),
                       lambda: os.setxattr(m / "kept", "user.k", b"v"), lambda: os.chmod(m / "kept", 0o600)]
            for change in changes:
                with raises_errno(errno.EIO):
                    change()
            assert sorted(os.listdir(m)) == tree and read_file(m / "kept") == b"k" * 10_000
            assert stats(m)["broken"]
        image = tmp_path / "ext4.img"
        subprocess.run(["umount", str(backing)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(backing)], check=True)
        lines: list[str] = []
        report = fsck.check(str(pack), out=lines.append)
        assert report.exit_code == 0 and not report.problems, lines
        with mounted(pack, mnt) as m:
            assert read_file(m / "kept") == b"k" * 10_000
            assert not os.path.exists(m / "lost")
