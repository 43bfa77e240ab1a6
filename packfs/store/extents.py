"""Extent maps: which byte ranges of a file live in which volume records.

A map is a list of `Extent` tuples sorted by file offset and never overlapping:

    (file_offset, length, volume, record_offset, skip, record_length)

`skip` is where the extent starts inside the record's payload; `record_length` is the
payload length, so a record can be freed exactly once no extent refers to it. A record
is named by its key (volume, record_offset, record_length).

A map at rest (in the inode table, a catalog row, a journal row) is packed: each extent
as six little-endian integers, back to back (`pack`); a journal row may log a long map's
edits instead (`pack_edits`).
"""
from __future__ import annotations

import struct
from bisect import bisect_left
from typing import Iterator

Extent = tuple[int, int, int, int, int, int]
RecordKey = tuple[int, int, int]
INFINITY = 1 << 63
PACKED = struct.Struct("<QIIQII")  # one extent of a packed map
PACKED_MAX = 8  # longer maps stay Python lists in the inode table: cheap to edit


def key(e: Extent) -> RecordKey:
    return (e[2], e[3], e[5])


def punch(extents: list[Extent], start: int, end: int) -> tuple[list[Extent], list[RecordKey], list[RecordKey]]:
    """Remove [start, end) from the map, in place.

    Returns the map, the record keys that lost an extent entirely (dropped) and those
    that gained one because an extent was split in two (split).
    """
    if start >= end or not extents:
        return extents, [], []
    i = bisect_left(extents, (start,))
    if i > 0 and extents[i - 1][0] + extents[i - 1][1] > start:
        i -= 1
    j = bisect_left(extents, (end,), lo=i)
    if i == j:
        return extents, [], []
    kept: list[Extent] = []
    dropped: list[RecordKey] = []
    split: list[RecordKey] = []
    for f, ln, v, r, s, rl in extents[i:j]:
        left = f < start
        right = f + ln > end
        if left:
            kept.append((f, start - f, v, r, s, rl))
        if right:
            kept.append((end, f + ln - end, v, r, s + (end - f), rl))
        if left and right:
            split.append((v, r, rl))
        elif not left and not right:
            dropped.append((v, r, rl))
    extents[i:j] = kept
    return extents, dropped, split


def insert(extents: list[Extent], e: Extent) -> tuple[list[Extent], list[RecordKey], list[RecordKey]]:
    """Map [e.file_offset, +e.length) to a new record, replacing what was there."""
    start = e[0]
    if not extents or extents[-1][0] + extents[-1][1] <= start:  # the append fast path
        extents.append(e)
        return extents, [], []
    extents, dropped, split = punch(extents, start, start + e[1])
    extents.insert(bisect_left(extents, (start,)), e)
    return extents, dropped, split


def pieces(extents: list[Extent], start: int, end: int) -> Iterator[tuple[int, int, Extent | None]]:
    """Cover [start, end) with (offset, length, extent-or-None-for-a-hole) pieces."""
    i = bisect_left(extents, (start,))
    if i > 0 and extents[i - 1][0] + extents[i - 1][1] > start:
        i -= 1
    pos = start
    for e in extents[i:]:
        if pos >= end:
            break
        f, ln = e[0], e[1]
        if f >= end:
            break
        if f > pos:
            yield pos, f - pos, None
            pos = f
        stop = min(end, f + ln)
        if stop > pos:
            yield pos, stop - pos, e
            pos = stop
    if pos < end:
        yield pos, end - pos, None


def pack(extents: list[Extent] | None) -> bytes | None:
    if extents is None:
        return None
    return b"".join([PACKED.pack(*e) for e in extents])


def unpack(blob: bytes | None) -> list[Extent] | None:
    return None if blob is None else list(PACKED.iter_unpack(blob))


def pack_edits(edits: list[Extent | int]) -> list[bytes | int]:
    """A map's edits as a journal row logs them, in order: each run of extents mapped
    (Namespace.map_extent) packed, each truncation (truncate_extents) as its size."""
    out: list[bytes | int] = []
    run: list[Extent] = []
    for edit in edits:
        if isinstance(edit, int):
            if run:
                out.append(pack(run))  # type: ignore[arg-type]
                run = []
            out.append(edit)
        else:
            run.append(edit)
    if run:
        out.append(pack(run))  # type: ignore[arg-type]
    return out


def replay_edits(extents: list[Extent], edits: list[bytes | int]) -> list[Extent]:
    """Make the same edits to a map (recovery): the map they were made to comes out."""
    for edit in edits:
        if isinstance(edit, int):
            punch(extents, edit, INFINITY)
        else:
            for e in PACKED.iter_unpack(edit):
                insert(extents, e)
    return extents
