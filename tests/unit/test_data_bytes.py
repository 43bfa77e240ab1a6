"""The data a file holds (st_blocks): its mapped extents and its unflushed run, holes not
counted and bytes both mapped and buffered counted once."""
from __future__ import annotations

import stat

import trio
from started import with_filesystem

from packfs.core.filesystem import FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem
from packfs.namespace.namespace import ROOT

REG = stat.S_IFREG | 0o644


def test_data_bytes(tmp_path):
    async def body(fs: Filesystem, nursery: trio.Nursery) -> None:
        node = fs.create(ROOT, b"f", REG, 0, 0)
        fh = fs.open(node.ino)
        await fs.write(fh, 0, b"a" * 5000)
        assert fs.wb.data_bytes(node) == 5000  # all in the run
        await fs.release(fh)
        assert node.wbuf is None and fs.wb.data_bytes(node) == 5000  # one whole record
        fh = fs.open(node.ino)
        await fs.write(fh, 1000, b"b" * 1000)  # over mapped bytes: counted once
        assert node.wbuf is not None and fs.wb.data_bytes(node) == 5000
        await fs.write(fh, 2000, b"c" * 6000)  # grows the run past the mapped end
        assert fs.wb.data_bytes(node) == 8000
        await fs.write(fh, 1 << 20, b"d" * 10)  # a hole between: flushes the run first
        assert fs.wb.data_bytes(node) == 8010
        await fs.release(fh)
        fs.fallocate(node.ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)
        assert fs.wb.data_bytes(node) == 8010 - 4096
        assert node.t.mapped_bytes(ROOT) == 0
        d = fs.create(ROOT, b"many", REG, 0, 0)  # a map kept as a list
        fh = fs.open(d.ino)
        for i in range(20):
            await fs.write(fh, i * 8192, b"e" * 100)
        await fs.release(fh)
        assert d.t.extent_count(d.ino) == 20 and isinstance(d.t.extents[d.ino], list)
        assert fs.wb.data_bytes(d) == 2000

    with_filesystem(tmp_path, body)
