"""Write-behind on a started Filesystem (no FUSE): what it keeps buffered, and for how long."""
from __future__ import annotations

from test_recovery import REG, ROOT, Filesystem, packdir, read_all, run  # noqa: F401 (packdir is a fixture)


def test_buffered_runs_stay_under_max_dirty(packdir):
    """Files written and closed without an fsync, whose close sends no release (create's
    handles under filecache), leave their runs buffered: past max_dirty the oldest go to
    the log, so memory stays bounded, and every byte reads back."""
    async def body(fs: Filesystem) -> None:
        fs.wb.max_dirty = 64 * 1024
        inos = []
        for i in range(40):
            node = fs.create(ROOT, b"f%d" % i, REG, 0, 0)
            fh = fs.created_handle(node.ino, privileged=False)
            await fs.write(fh, 0, bytes([i]) * 5000)
            assert fs.wb.dirty_bytes <= fs.wb.max_dirty
            inos.append(node.ino)
        assert 0 < fs.wb.dirty_bytes <= fs.wb.max_dirty
        assert inos[0] not in fs.wb.dirty and inos[-1] in fs.wb.dirty  # the oldest went first
        for i, ino in enumerate(inos):
            assert await read_all(fs, ino) == bytes([i]) * 5000

    run(packdir, body, clean=True)
