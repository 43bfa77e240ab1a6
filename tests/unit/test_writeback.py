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


def test_a_record_read_whole_is_not_kept_in_the_read_cache_one_read_in_parts_is(packdir):
    """The kernel keeps the pages of a file read whole (every small Swift object), so the
    daemon keeps no third copy of its record; a record read in parts is kept for the rest."""
    async def body(fs: Filesystem) -> None:
        sizes = {b"small": 4096, b"large": 300_000}
        inos = {}
        for name, size in sizes.items():
            node = fs.create(ROOT, name, REG, 0, 0)
            fh = fs.created_handle(node.ino, privileged=False)
            await fs.write(fh, 0, name * (size // len(name)))
            await fs.fsync()
            assert len(node.extent_list()) == 1  # one record each
            inos[name] = node.ino
        cache = fs.volumes._cache
        cache.clear()
        fh = fs.created_handle(inos[b"small"], privileged=False)
        assert await fs.read(fh, 0, 128 * 1024) == b"small" * (4096 // 5)
        assert not cache
        fh = fs.created_handle(inos[b"large"], privileged=False)
        assert await fs.read(fh, 0, 128 * 1024) == (b"large" * 60_000)[:128 * 1024]
        assert list(map(len, cache.values())) == [len(b"large") * 60_000]

    run(packdir, body, clean=True)
