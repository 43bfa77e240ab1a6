"""The daemon's log, PACKDIR/packfs.log, under logrotate's default rotation."""
from __future__ import annotations

from mounts import mounted


def test_a_rotated_log_is_reopened(tmp_path, packdir):
    """logrotate renames the file and the daemon's next line goes to a new packfs.log,
    not on into the renamed one."""
    log = packdir / "packfs.log"
    with mounted(packdir, tmp_path / "mnt"):
        assert "serving" in log.read_text()
        log.rename(packdir / "packfs.log.1")
    rotated, fresh = (packdir / "packfs.log.1").read_text(), log.read_text()
    assert "serving" in rotated and "unmounted" not in rotated
    assert "unmounted; writing the final checkpoint" in fresh and "serving" not in fresh
