"""Write-behind: coalesce each file's writes into `chunk_size` appends.

A file has at most one contiguous run of unflushed bytes. A write that extends or
overlaps the run joins it; any other write first flushes the run. A run is flushed as
records of exactly `chunk_size` once it is that big, and whole on fsync (by the
journal's commit) or on release. Nothing ever waits on a timer for more data (the
Nagle lesson). Once the buffered bytes pass `max_dirty`, the oldest runs are flushed
(files written and closed without an fsync, whose close sends no release, would
otherwise wait for the next commit), and writers are held back once the bytes queued
for the disk pass it: memory stays bounded.
"""
from __future__ import annotations

import time

from ..namespace.inodes import Inode
from ..namespace.namespace import Namespace
from ..store import extents as ext
from ..store import records
from ..store.volumes import Volumes


class Buffer:
    """A file's unflushed run: the bytes from `start`, as the writes' own buffers.

    Writes that extend the run are kept as they came, and become the record's own
    buffers (records.encode): the loop never copies them into a growing buffer
    (measured: 31 against 3 us per 64 KiB write). A write over bytes already in the run
    joins the parts first. Callers must not change a buffer once they have put it here.
    """
    __slots__ = ("start", "size", "parts", "reserved")

    def __init__(self, start: int) -> None:
        self.start = start
        self.size = 0
        self.parts: list[bytes | bytearray | memoryview] = []
        self.reserved = 0  # volume space held for this run until it is flushed

    @property
    def end(self) -> int:
        return self.start + self.size

    def put(self, pos: int, data: bytes | bytearray | memoryview) -> int:
        """Write data at pos (at most `size`) within the run; returns how much it grew."""
        n = len(data)
        if pos == self.size:
            self.parts.append(data)
            self.size += n
            return n
        joined = bytearray().join(self.parts)
        joined[pos:pos + n] = data
        self.parts = [joined]
        grown = len(joined) - self.size
        self.size = len(joined)
        return grown

    def first(self, n: int) -> list[bytes | bytearray | memoryview]:
        """The run's first n bytes, as parts (left in the run: see consume)."""
        out = []
        for p in self.parts:
            if n <= 0:
                break
            out.append(p if len(p) <= n else memoryview(p)[:n])
            n -= len(p)
        return out

    def consume(self, n: int) -> None:
        """Drop the run's first n bytes (they are in a record now)."""
        self.start += n
        self.size -= n
        while n:
            p = self.parts[0]
            if len(p) > n:
                self.parts[0] = memoryview(p)[n:]
                return
            del self.parts[0]
            n -= len(p)

    def truncate(self, n: int) -> None:
        """Keep only the run's first n bytes."""
        self.parts = self.first(n)
        self.size = n

    def copy_into(self, out: bytearray, out_start: int) -> None:
        """Lay the run over out, which holds the file's bytes from out_start."""
        pos = self.start - out_start
        for p in self.parts:
            lo, hi = max(pos, 0), min(pos + len(p), len(out))
            if lo < hi:
                out[lo:hi] = memoryview(p)[lo - pos:hi - pos]
            pos += len(p)
            if pos >= len(out):
                break


class WriteBehind:
    def __init__(self, ns: Namespace, volumes: Volumes, chunk_size: int, max_dirty: int,
                 kernel_times: bool = False) -> None:
        self.ns = ns
        self.volumes = volumes
        self.chunk_size = chunk_size
        self.max_dirty = max_dirty
        # With the kernel's writeback cache the kernel keeps a file's mtime and ctime, and
        # sends them (a SETATTR) on fsync, on the last close and when it writes the inode
        # back. A WRITE comes when it writes its pages back, later than the write() and
        # often after those times: setting them then left the file with the daemon's
        # later times, which the next mount showed (ms apart from what stat had shown).
        self.kernel_times = kernel_times
        self.dirty: dict[int, Inode] = {}
        self.dirty_bytes = 0

    async def write(self, node: Inode, offset: int, data: bytes) -> int:
        """Buffer a write, holding volume space for it: ENOSPC here, never at flush.

        A write that fails leaves the file as it was, so later commits do not
        inherit its bytes (ext4's delayed allocation reserves blocks the same way).
        """
        while True:
            buf = node.wbuf
            if buf is not None and not (buf.start <= offset <= buf.end):
                self.flush(node)  # its space is held already
                continue
            start = offset if buf is None else buf.start
            end = offset + len(data) if buf is None else max(buf.end, offset + len(data))
            need = self._cost(end - start) - (buf.reserved if buf else 0)
            if need > 0 and not self.volumes.has_room(need):
                await self.volumes.ensure_space(need)
                continue  # the run may have moved on while we waited
            break
        if buf is None:
            buf = node.wbuf = Buffer(offset)
            self.dirty[node.ino] = node
        grown = buf.put(offset - buf.start, data)
        self._hold(buf)
        self.dirty_bytes += grown
        node.size = max(node.size, offset + len(data))
        if not self.kernel_times:
            node.modified(time.time_ns())
        self.ns.touch(node)
        if buf.size >= self.chunk_size:
            self._flush_chunks(node)
        if self.dirty_bytes > self.max_dirty:
            self._flush_oldest()
        if self.dirty_bytes + self.volumes.queued_bytes > self.max_dirty:
            await self.volumes.wait_written(self.volumes.last_ticket)
        return len(data)

    def could_take(self, n: int) -> bool:
        """Whether the disk has room for n more bytes of a file now (nothing is held)."""
        return self.volumes.could_take(self._cost(n))

    def punch(self, node: Inode, start: int, end: int) -> None:
        """A hole in [start, end): a buffered run that reaches into it goes to the log
        first, so the hole cuts its bytes as it cuts those of earlier records."""
        buf = node.wbuf
        if buf is not None and buf.start < end and buf.end > start:
            self.flush(node)
        self.ns.punch(node, start, end)

    def _cost(self, n: int) -> int:
        """Volume bytes n buffered bytes take once flushed: whole chunks, then the rest."""
        chunks, rest = divmod(n, self.chunk_size)
        return chunks * records.footprint(self.chunk_size) + (records.footprint(rest) if rest else 0)

    def _hold(self, buf: Buffer) -> None:
        """Bring the space held for a run in line with its size."""
        cost = self._cost(buf.size)
        self.volumes.reserved += cost - buf.reserved
        buf.reserved = cost

    def _flush_chunks(self, node: Inode) -> None:
        """Append the whole chunks of a file's run; keep the tail buffered."""
        buf = node.wbuf
        if buf is None:
            return
        while buf.size >= self.chunk_size:
            self._append(node, buf, self.chunk_size)
        self._hold(buf)
        if not buf.size:
            self._drop(node)

    def flush(self, node: Inode) -> None:
        """Append a file's whole run now (fsync, release, or a non-contiguous write)."""
        self._flush_chunks(node)
        buf = node.wbuf
        if buf is None:
            return
        self._append(node, buf, buf.size)
        self._drop(node)

    def _flush_oldest(self) -> None:
        """Flush whole runs, the oldest first, until half of max_dirty is buffered."""
        for node in list(self.dirty.values()):
            if self.dirty_bytes <= self.max_dirty // 2:
                return
            self.flush(node)

    def flush_all(self) -> None:
        for node in list(self.dirty.values()):
            self.flush(node)

    def _append(self, node: Inode, buf: Buffer, n: int) -> None:
        """Append the run's first n bytes as one record (they stay in the run if that fails).
        A record that is the whole file carries its xattrs too, where they fit and are to
        leave memory (InodeTable.trailer_for)."""
        offset, table = buf.start, self.ns.table
        whole = offset == 0 and n == node.size
        trailer = table.trailer_for(node.ino, n) if whole else b""
        vol, roff, _ = self.volumes.append(records.DATA, node.ino, offset, *buf.first(n), trailer=trailer)
        buf.consume(n)
        self.dirty_bytes -= n
        self.ns.map_extent(node, (offset, n, vol, roff, 0, n))
        if trailer:
            table.wrote_trailer(node.ino)

    def _drop(self, node: Inode) -> None:
        if node.wbuf is not None:
            self.volumes.reserved -= node.wbuf.reserved
        node.wbuf = None
        self.dirty.pop(node.ino, None)

    def discard(self, node: Inode) -> None:
        """Forget unflushed bytes of a file that is gone."""
        if node.wbuf is not None:
            self.dirty_bytes -= node.wbuf.size
            self._drop(node)

    def truncate(self, node: Inode, size: int) -> None:
        buf = node.wbuf
        if buf is not None and buf.end > size:
            if buf.start >= size:
                self.discard(node)
            else:
                self.dirty_bytes -= buf.end - size
                buf.truncate(size - buf.start)
                self._hold(buf)
        if size < node.size:
            self.ns.truncate_extents(node, size)
        node.size = size

    def data_bytes(self, node: Inode) -> int:
        """The bytes of a file's data that records or its unflushed run hold: holes hold
        none (st_blocks, so that du and cp --sparse see them)."""
        mapped = node.t.mapped_bytes(node.ino)
        run = node.wbuf
        if run is None or not run.size:
            return mapped
        under = sum(n for _, n, e in ext.pieces(node.extent_list(), run.start, run.end) if e is not None)
        return mapped + run.size - under

    async def read(self, node: Inode, offset: int, size: int) -> bytes:
        """File contents: records, holes as zeros, and the unflushed run on top."""
        while True:
            end = min(offset + size, node.size)
            if offset >= end:
                return b""
            extents = node.extent_list()
            plan = list(ext.pieces(extents, offset, end))
            parts: list[tuple[int, memoryview]] = []  # (file offset, bytes of a record)
            for pos, length, e in plan:
                if e is not None:
                    start = e[4] + (pos - e[0])
                    payload = await self.volumes.read(e[2], e[3], e[5], node.ino, keep=length < e[5])
                    parts.append((pos, memoryview(payload)[start:start + length]))
            if plan == list(ext.pieces(node.extent_list(), offset, min(offset + size, node.size))):
                break  # no flush or truncate raced with the reads above
        if node.wbuf is None and len(parts) == 1 and len(parts[0][1]) == end - offset:
            return bytes(parts[0][1])  # one record's piece (a small object read whole): one copy
        out = bytearray(end - offset)
        for pos, piece in parts:
            out[pos - offset:pos - offset + len(piece)] = piece
        if node.wbuf is not None:
            node.wbuf.copy_into(out, offset)
        return bytes(out)
