"""Reading every volume from offset 0: each record's header and payload checksum, and
the damaged blocks between records."""
from __future__ import annotations

from dataclasses import dataclass, field

from zlib_ng.zlib_ng import crc32

from ..progress import QUIET, Progress
from ..store import records
from ..store.disk import Disk
from ..store.volumes import Volumes, volume_name


BLOCK = records.BLOCK
CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)


@dataclass(slots=True)
class Scanned:
    volume: int
    offset: int
    header: records.Header
    intact: bool  # payload CRC verified
    reason: str = ""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.volume, self.offset, self.header.length)

    @property
    def end(self) -> int:
        return self.offset + self.header.footprint


@dataclass
class Scan:
    records: dict[tuple[int, int], Scanned] = field(default_factory=dict)
    garbage: list[tuple[int, int, int, str]] = field(default_factory=list)  # volume, start, end, reason
    sizes: dict[int, int] = field(default_factory=dict)

    def garbage_at(self, vol: int, off: int) -> tuple[int, int, int, str] | None:
        for g in self.garbage:
            if g[0] == vol and g[1] <= off < g[2]:
                return g
        return None


class _Reader:
    """Reads a volume in large chunks, each starting on a block.

    On a block: a zero run is skipped to the end of the chunk (zeros_until), and records
    start on blocks. A chunk read from where a record's payload starts (48 bytes past
    its block) put every position after a skipped run 48 bytes off, and every record
    there was read as damaged: a healthy pack with punched holes showed thousands of
    files corrupt, and --repair would have punched their live records.
    """

    def __init__(self, disk: Disk, fd: int, size: int) -> None:
        self.disk, self.fd, self.size = disk, fd, size
        self.start, self.buf = 0, b""

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset < self.start or end > self.start + len(self.buf):
            start = offset - offset % BLOCK
            if end - start > CHUNK:
                return self.disk.pread(self.fd, end - offset, offset)
            self.start = start
            self.buf = self.disk.pread(self.fd, min(CHUNK, self.size - start), start)
        return self.buf[offset - self.start: end - self.start]

    def zeros_until(self, offset: int) -> int:
        """The end of the chunk in memory (a block's start, or the volume's end) if it is
        all zeros from offset on, else offset."""
        rest = self.buf[offset - self.start:]
        if offset >= self.start and rest == _ZEROS[:len(rest)]:
            return self.start + len(self.buf)
        return offset


def scan_volumes(disk: Disk, volumes: Volumes, progress: Progress = QUIET) -> Scan:
    out = Scan()
    existing = volumes.existing()
    for n, vol in enumerate(existing, 1):
        fd = volumes.fd(vol)
        size = disk.size(fd)
        out.sizes[vol] = size
        progress.step(f"reading volume {volume_name(vol)} ({n} of {len(existing)}, {size / 2**30:.2f} GiB)")
        r = _Reader(disk, fd, size)
        pos = 0
        bad_start, bad_reason = -1, ""

        def end_bad(at: int) -> None:
            nonlocal bad_start
            if bad_start >= 0:
                out.garbage.append((vol, bad_start, at, bad_reason))
                bad_start = -1

        while pos < size:
            blk = r.read(pos, BLOCK)
            if blk == _ZEROS[:len(blk)]:
                end_bad(pos)
                pos = max(pos + BLOCK, r.zeros_until(pos))
                continue
            try:
                header = records.decode_header(blk, volumes.pack_id)
            except records.RecordError as e:
                if bad_start < 0:
                    bad_start, bad_reason = pos, str(e)
                pos += BLOCK
                continue
            end_bad(pos)
            if pos + records.HEADER_SIZE + header.length > size:
                rec = Scanned(vol, pos, header, False, "record runs past the end of the volume")
            else:
                payload = r.read(pos + records.HEADER_SIZE, header.length)
                ok = crc32(payload) == header.payload_crc
                rec = Scanned(vol, pos, header, ok, "" if ok else "payload checksum mismatch")
            out.records[(vol, pos)] = rec
            pos += header.footprint
            if not len(out.records) & 1023:
                progress(lambda: f"volume {volume_name(vol)} ({n} of {len(existing)}): {pos / 2**30:.2f} of "
                                 f"{size / 2**30:.2f} GiB read, {len(out.records):,} records checked")
        end_bad(min(pos, size))
    return out
