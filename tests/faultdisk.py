"""A `packfs.store.disk.Disk` that keeps volume files in memory, records every backing
operation, simulates a power cut and injects I/O errors.

In the style of RocksDB's FaultInjectionTestFS and SQLite's crash tests:

* Every pwrite, truncate, punch_hole, allocate, fdatasync and fsync_dir is recorded in
  `trace`, in the order the calls completed (a total order: calls are serialised by a
  lock, so the appender thread and the event loop interleave into one sequence).
* Each file has a **durable image** (what a power cut keeps for sure: everything a
  completed fdatasync of *that* file flushed) and a list of **pending** operations
  since that flush. The live image (what reads see) is the durable image with every
  pending operation applied.
* A file created since the last `fsync_dir` of its directory is not durably named: a
  power cut may drop it entirely; a file removed since then may come back, with its
  durable contents and any subset of its pending writes (the durability contract's
  crash model, applied to the backing filesystem too).
* `power_cut(rng)` returns a new FaultDisk holding the state after a power cut now: the
  durable images plus a random (seeded) subset of the pending operations, applied in
  order, where a kept pwrite may also be **torn** -- only a prefix of it, or an
  arbitrary subset of its sectors (512 B or 4 KiB), reached the platter.
* `FaultDisk.replayer(trace)` rebuilds the disk as it was after any prefix of a
  recorded trace, so a campaign runs a workload once and cuts power at every point of
  it afterwards.
* `inject(op, errno, nth=, times=, when=)` fails chosen reads, writes, flushes... with
  EIO (or any errno); `capacity` makes the disk small, so allocation and writes that
  need new blocks fail with ENOSPC and statvfs reports the space left.

Paths are kept relative to `root`, so a crashed image can be opened under another
directory. The volume files never touch the real disk; everything else in a pack
directory (packfs.json, the SQLite catalog) stays on the real filesystem.
"""
from __future__ import annotations

import errno as E
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from packfs.store.disk import Disk

PAGE = 4096
ZERO_PAGE = bytes(PAGE)

# Operations a fault can be injected into.
OPS = ("open", "pread", "pwrite", "fdatasync", "fsync_dir", "punch", "truncate", "allocate", "statvfs", "remove")


class Image:
    """The contents of one file: a size, sparse 4 KiB pages, and the allocated pages."""

    __slots__ = ("size", "pages", "alloc")

    def __init__(self) -> None:
        self.size = 0
        self.pages: dict[int, bytes] = {}
        self.alloc: set[int] = set()

    def copy(self) -> "Image":
        c = Image()
        c.size, c.pages, c.alloc = self.size, dict(self.pages), set(self.alloc)
        return c

    def new_pages(self, offset: int, length: int) -> int:
        """How many pages a write or allocation of this range would newly allocate."""
        if length <= 0:
            return 0
        first, last = offset // PAGE, (offset + length - 1) // PAGE
        return sum(1 for p in range(first, last + 1) if p not in self.alloc)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        data = bytes(data)
        end = offset + len(data)
        pos = offset
        while pos < end:
            pi, po = divmod(pos, PAGE)
            n = min(PAGE - po, end - pos)
            chunk = data[pos - offset: pos - offset + n]
            if po == 0 and n == PAGE:
                self.pages[pi] = chunk
            else:
                old = self.pages.get(pi, ZERO_PAGE)
                self.pages[pi] = old[:po] + chunk + old[po + n:]
            self.alloc.add(pi)
            pos += n
        self.size = max(self.size, end)

    def truncate(self, size: int) -> None:
        if size < self.size:
            keep = -(-size // PAGE)
            for pi in [p for p in self.pages if p >= keep]:
                del self.pages[pi]
            self.alloc = {p for p in self.alloc if p < keep}
            pi, po = divmod(size, PAGE)
            if po and pi in self.pages:
                self.pages[pi] = self.pages[pi][:po] + bytes(PAGE - po)
        self.size = size

    def punch(self, offset: int, length: int) -> None:
        end = offset + length
        pos = offset
        while pos < end:
            pi, po = divmod(pos, PAGE)
            n = min(PAGE - po, end - pos)
            if po == 0 and n == PAGE:
                self.pages.pop(pi, None)
                self.alloc.discard(pi)
            elif pi in self.pages:
                old = self.pages[pi]
                self.pages[pi] = old[:po] + bytes(n) + old[po + n:]
            pos += n

    def allocate(self, offset: int, length: int) -> None:
        if length <= 0:
            return
        self.alloc.update(range(offset // PAGE, (offset + length - 1) // PAGE + 1))
        self.size = max(self.size, offset + length)

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        out = bytearray()
        pos = offset
        while pos < end:
            pi, po = divmod(pos, PAGE)
            n = min(PAGE - po, end - pos)
            out += self.pages.get(pi, ZERO_PAGE)[po:po + n]
            pos += n
        return bytes(out)

    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "pwrite":
            self.write(op[1], op[2])
        elif kind == "truncate":
            self.truncate(op[1])
        elif kind == "punch":
            self.punch(op[1], op[2])
        elif kind == "allocate":
            self.allocate(op[1], op[2])
        else:  # pragma: no cover
            raise ValueError(kind)


class FileState:
    __slots__ = ("live", "durable", "pending", "named")

    def __init__(self) -> None:
        self.live = Image()
        self.durable = Image()
        self.pending: list[tuple] = []  # ("pwrite", off, data) | ("truncate", size) | ("punch", off, len) | ...
        self.named = False  # durably in its directory (an fsync_dir since it was created)


@dataclass
class Fault:
    """Fail the nth, nth+1, ... nth+times-1 matching call (times=None: every one from nth)."""

    op: str
    errno: int = E.EIO
    nth: int = 1
    times: int | None = 1
    when: Callable[[str, int, int], bool] | None = None  # (relative path, offset, length)
    seen: int = 0
    hits: int = 0

    def fires(self, op: str, path: str, offset: int, length: int) -> bool:
        if op != self.op or (self.when is not None and not self.when(path, offset, length)):
            return False
        self.seen += 1
        if self.seen < self.nth or (self.times is not None and self.seen >= self.nth + self.times):
            return False
        self.hits += 1
        return True


@dataclass
class CutReport:
    """What a power cut kept of the pending operations."""

    kept: int = 0
    dropped: int = 0
    torn: int = 0
    files_dropped: list[str] = field(default_factory=list)
    files_back: list[str] = field(default_factory=list)  # removed files whose unlink the cut lost
    lost_punches: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return self.kept + self.dropped + self.torn


class FaultDisk(Disk):
    """An in-memory, recording, fault-injecting Disk. See the module docstring."""

    def __init__(self, root: str, capacity: int | None = None, record: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.capacity = capacity  # bytes of allocated pages the disk holds, or None for unlimited
        self.record = record
        self.files: dict[str, FileState] = {}
        self.unlinked: list[tuple[str, FileState]] = []  # removed since the last fsync_dir of their directory
        self.trace: list[tuple] = []
        self.faults: list[Fault] = []
        self.calls: dict[str, int] = {}
        self.lock = threading.RLock()
        self._fds: dict[int, str] = {}
        self._next_fd = 1000

    # -- helpers ----------------------------------------------------------------

    def rel(self, path: str) -> str:
        return os.path.relpath(os.path.abspath(path), self.root)

    def _path(self, fd: int) -> str:
        try:
            return self._fds[fd]
        except KeyError:
            raise OSError(E.EBADF, os.strerror(E.EBADF)) from None

    def _check(self, op: str, path: str, offset: int = 0, length: int = 0) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        for f in self.faults:
            if f.fires(op, path, offset, length):
                self._event(("fail", op, path, f.errno))
                raise OSError(f.errno, f"injected: {os.strerror(f.errno)}")

    def _event(self, ev: tuple) -> None:
        if self.record:
            self.trace.append(ev)

    def used_bytes(self) -> int:
        return sum(len(f.live.alloc) for f in self.files.values()) * PAGE

    def _need_space(self, st: FileState, offset: int, length: int) -> None:
        if self.capacity is not None and \
                self.used_bytes() + st.live.new_pages(offset, length) * PAGE > self.capacity:
            raise OSError(E.ENOSPC, os.strerror(E.ENOSPC))

    # -- fault injection --------------------------------------------------------

    def inject(self, op: str, errno: int = E.EIO, nth: int = 1, times: int | None = 1,
               when: Callable[[str, int, int], bool] | None = None) -> Fault:
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}; one of {OPS}")
        f = Fault(op, errno, nth, times, when)
        with self.lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def mark(self, label: str, data: object = None) -> int:
        """Put a label (op boundaries, catalog snapshots) into the trace; returns its index."""
        with self.lock:
            self._event(("mark", label, data))
            return len(self.trace) - 1

    # -- applying operations (live calls and trace replay share this) ------------

    def _apply(self, ev: tuple) -> None:
        kind = ev[0]
        if kind in ("mark", "fail"):
            return
        if kind == "create":
            self.files[ev[1]] = FileState()
            return
        if kind == "fsync_dir":
            for path, st in self.files.items():
                if _dir(path) == ev[1]:
                    st.named = True
            self.unlinked = [(p, st) for p, st in self.unlinked if _dir(p) != ev[1]]
            return
        if kind == "remove":
            st = self.files.pop(ev[1])
            if st.named:
                self.unlinked.append((ev[1], st))
            return
        st = self.files[ev[1]]
        if kind == "fdatasync":
            for op in st.pending:
                st.durable.apply(op)
            st.pending.clear()
            return
        op = (kind, *ev[2:])
        st.live.apply(op)
        st.pending.append(op)

    def _do(self, ev: tuple) -> None:
        self._event(ev)
        self._apply(ev)

    # -- the Disk interface -------------------------------------------------------

    def open(self, path: str, create: bool = False) -> int:
        with self.lock:
            rel = self.rel(path)
            self._check("open", rel)
            if rel not in self.files:
                if not create:
                    raise FileNotFoundError(E.ENOENT, os.strerror(E.ENOENT), path)
                self._do(("create", rel))
            fd = self._next_fd
            self._next_fd += 1
            self._fds[fd] = rel
            return fd

    def close(self, fd: int) -> None:
        with self.lock:
            self._fds.pop(fd, None)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        with self.lock:
            rel = self._path(fd)
            self._check("pwrite", rel, offset, len(data))
            self._need_space(self.files[rel], offset, len(data))
            self._do(("pwrite", rel, offset, bytes(data)))

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        with self.lock:
            rel = self._path(fd)
            self._check("pread", rel, offset, length)
            return self.files[rel].live.read(offset, length)

    def prefetch(self, fd: int, length: int, offset: int) -> None:
        """Nothing to read ahead: the image is in memory."""

    def pread_cached(self, fd: int, length: int, offset: int) -> None:
        """Never "cached": every read goes through pread, where faults are injected."""
        return None

    def fdatasync(self, fd: int) -> None:
        with self.lock:
            rel = self._path(fd)
            self._check("fdatasync", rel)
            self._do(("fdatasync", rel))

    def fsync_dir(self, path: str) -> None:
        with self.lock:
            rel = self.rel(path)
            self._check("fsync_dir", rel)
            self._do(("fsync_dir", rel))

    def punch_hole(self, fd: int, offset: int, length: int) -> None:
        with self.lock:
            rel = self._path(fd)
            self._check("punch", rel, offset, length)
            self._do(("punch", rel, offset, length))

    def allocate(self, fd: int, offset: int, length: int, zeros: bool = True) -> None:
        """Written zeros and fallocated blocks alike read as zeros and are lost unless flushed."""
        with self.lock:
            rel = self._path(fd)
            self._check("allocate", rel, offset, length)
            self._need_space(self.files[rel], offset, length)
            self._do(("allocate", rel, offset, length))

    def truncate(self, fd: int, size: int) -> None:
        with self.lock:
            rel = self._path(fd)
            self._check("truncate", rel, size)
            self._do(("truncate", rel, size))

    def size(self, fd: int) -> int:
        with self.lock:
            return self.files[self._path(fd)].live.size

    def allocated_bytes(self, fd: int) -> int:
        with self.lock:
            return len(self.files[self._path(fd)].live.alloc) * PAGE

    def has_data(self, fd: int) -> bool:
        with self.lock:
            return bool(self.files[self._path(fd)].live.pages)

    def remove(self, path: str) -> None:
        with self.lock:
            rel = self.rel(path)
            self._check("remove", rel)
            if rel not in self.files:
                raise FileNotFoundError(E.ENOENT, os.strerror(E.ENOENT), path)
            self._do(("remove", rel))

    def listdir(self, path: str) -> list[str]:
        with self.lock:
            rel = self.rel(path)
            return sorted(os.path.basename(p) for p in self.files if _dir(p) == rel)

    def statvfs(self, path: str) -> os.statvfs_result:
        with self.lock:
            self._check("statvfs", self.rel(path))
            if self.capacity is None:
                real = os.path.abspath(path)
                while not os.path.exists(real):
                    real = os.path.dirname(real)
                return os.statvfs(real)
            blocks = self.capacity // PAGE
            free = max(0, blocks - self.used_bytes() // PAGE)
            return os.statvfs_result((PAGE, PAGE, blocks, free, free, 1 << 20, 1 << 20, 1 << 20, 0, 255))

    # -- inspection ---------------------------------------------------------------

    def read_file(self, rel: str, durable: bool = False) -> bytes:
        """The whole live (or durable) contents of a file, by its path relative to root."""
        with self.lock:
            st = self.files[rel]
            img = st.durable if durable else st.live
            return img.read(0, img.size)

    def pending_ops(self) -> int:
        with self.lock:
            return sum(len(st.pending) for st in self.files.values()) + \
                sum(1 for st in self.files.values() if not st.named) + len(self.unlinked)

    def corrupt(self, rel: str, offset: int, data: bytes) -> None:
        """Overwrite bytes in place, durably, without recording it (media damage, a stray write)."""
        with self.lock:
            st = self.files[rel]
            st.live.write(offset, data)
            st.durable.write(offset, data)

    # -- power cuts -----------------------------------------------------------------

    def power_cut(self, rng: random.Random | None = None, mode: str = "random", root: str | None = None,
                  p_keep: float = 0.5, p_torn: float = 0.4, sectors: Iterable[int] = (512, 4096)
                  ) -> tuple["FaultDisk", CutReport]:
        """The disk as a power cut now would leave it, and what the cut kept.

        mode: "none" keeps only what was flushed, "all" keeps every pending operation
        (a process crash, not a power cut), "random" tears a pending pwrite with
        probability p_torn, and keeps each other pending operation with probability p_keep.
        """
        if mode not in ("none", "all", "random"):
            raise ValueError(mode)
        rng = rng or random.Random()
        sectors = tuple(sectors)
        rep = CutReport()
        out = FaultDisk(root or self.root, capacity=self.capacity)
        with self.lock:
            back = {}
            for path, st in self.unlinked:  # the unlink was not made durable: it may be lost
                if path not in self.files and (mode == "none" or (mode == "random" and rng.random() >= p_keep)):
                    back[path] = st
                    rep.files_back.append(path)
            for path in sorted({**self.files, **back}):
                st = self.files.get(path) or back[path]
                if not st.named and (mode == "none" or (mode == "random" and rng.random() >= p_keep)):
                    rep.files_dropped.append(path)
                    rep.dropped += len(st.pending) + 1
                    continue
                img = st.durable.copy()
                for op in st.pending:
                    op = self._choose(op, mode, rng, p_keep, p_torn, sectors, rep)
                    if op is None:
                        continue
                    if op[0] == "pwrite_sectors":
                        for off, piece in op[1]:
                            img.write(off, piece)
                    else:
                        img.apply(op)
                new = FileState()
                new.live, new.durable, new.named = img, img.copy(), True
                out.files[path] = new
                for op in st.pending:
                    # A punch whose blocks still hold data after the cut was lost.
                    if op[0] == "punch" and any(p in img.pages for p in range(op[1] // PAGE, (op[1] + op[2]) // PAGE)):
                        rep.lost_punches.append((path, op[1], op[2]))
        return out, rep

    @staticmethod
    def _choose(op: tuple, mode: str, rng: random.Random, p_keep: float, p_torn: float,
                sectors: tuple[int, ...], rep: CutReport) -> tuple | None:
        if mode == "all":
            rep.kept += 1
            return op
        if mode == "none":
            rep.dropped += 1
            return None
        r = rng.random()
        if op[0] == "pwrite" and len(op[2]) > min(sectors) and r < p_torn:
            rep.torn += 1
            return _tear(op[1], op[2], rng.choice(sectors), rng)
        if op[0] == "pwrite":
            r = (r - p_torn) / (1 - p_torn) if len(op[2]) > min(sectors) else r
        if r < p_keep:
            rep.kept += 1
            return op
        rep.dropped += 1
        return None

    def snapshot(self) -> "FaultDisk":
        """A copy of the whole state (durable, pending, names), without trace, faults or open files."""
        with self.lock:
            out = FaultDisk(self.root, capacity=self.capacity, record=False)
            for path, st in self.files.items():
                new = FileState()
                new.live, new.durable = st.live.copy(), st.durable.copy()
                new.pending, new.named = list(st.pending), st.named
                out.files[path] = new
            out.unlinked = list(self.unlinked)  # their states are never changed again
            return out

    @classmethod
    def replayer(cls, trace: list[tuple], root: str, capacity: int | None = None,
                 base: "FaultDisk | None" = None) -> Iterator[tuple[int, "FaultDisk"]]:
        """Yield (i, disk) for i = 0..len(trace): the disk after the first i trace events.

        It starts empty, or from a copy of base (the disk the trace was recorded on, as it
        was before). The same disk object is advanced in place; cut power on it
        (power_cut) before asking for the next one.
        """
        sim = base.snapshot() if base is not None else cls(root, capacity=capacity, record=False)
        for i, ev in enumerate(trace):
            yield i, sim
            sim._apply(ev)
        yield len(trace), sim


def _dir(rel: str) -> str:
    return os.path.dirname(rel) or "."


def _tear(offset: int, data: bytes, sector: int, rng: random.Random) -> tuple:
    """A torn write: some of its sectors reached the platter, the others did not.

    A large write reaches the device as many requests, in any order, so a torn write
    keeps a prefix of its sectors, a suffix of them, or any subset of them (a third each).
    """
    first = offset - offset % sector
    bounds = list(range(first + sector, offset + len(data), sector))  # sector starts inside the write
    cuts = [offset, *bounds, offset + len(data)]
    pieces = [(cuts[i], data[cuts[i] - offset: cuts[i + 1] - offset]) for i in range(len(cuts) - 1)]
    if len(pieces) < 2:
        return ("pwrite_sectors", [])
    how = rng.random()
    if how < 1 / 3:
        n = rng.randrange(0, len(pieces))  # strictly fewer than all sectors
        return ("pwrite_sectors", pieces[:n])
    if how < 2 / 3:
        n = rng.randrange(1, len(pieces) + 1)  # at least the first sector is missing
        return ("pwrite_sectors", pieces[n:])
    keep = [p for p in pieces if rng.random() < 0.5]
    if len(keep) == len(pieces):
        keep.pop(rng.randrange(len(keep)))
    return ("pwrite_sectors", keep)
