"""A shared memory-limited cgroup for the object server, the packfs daemon and the walker.

cgroup v2 is used when its memory controller is available (a child of /sys/fs/cgroup with
memory.max).  On hosts whose memory controller is still bound to the v1 hierarchy (this
development VM: /sys/fs/cgroup/unified has no "memory" controller), the v1 memory
controller is used instead (memory.limit_in_bytes, with charges moved on migration).
Without either, the cgroup runs are skipped and the report says so.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from .util import log


def _v2_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        try:
            if "memory" in (root / "cgroup.controllers").read_text().split():
                return root
        except OSError:
            pass
    return None


def _v1_root() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    return root if (root / "memory.limit_in_bytes").exists() else None


def available() -> str | None:
    """'v2', 'v1' or None."""
    if _v2_root():
        return "v2"
    if _v1_root():
        return "v1"
    return None


class MemCgroup:
    def __init__(self, name: str, limit_bytes: int):
        self.limit = limit_bytes
        self.kind = available()
        self.path: Path | None = None
        self.parent_procs: Path | None = None
        self.name = name

    def __enter__(self) -> "MemCgroup":
        if self.kind == "v2":
            root = _v2_root()
            sub = root / "cgroup.subtree_control"
            try:
                if "memory" not in sub.read_text().split():
                    sub.write_text("+memory")
            except OSError as e:
                log(f"cgroup: cannot enable memory controller in {root}: {e}")
            self.path = root / self.name
            self.path.mkdir(exist_ok=True)
            (self.path / "memory.max").write_text(str(self.limit))
            try:
                (self.path / "memory.swap.max").write_text("0")
            except OSError:
                pass
            self.parent_procs = root / "cgroup.procs"
        elif self.kind == "v1":
            root = _v1_root()
            self.path = root / self.name
            self.path.mkdir(exist_ok=True)
            try:
                (self.path / "memory.move_charge_at_immigrate").write_text("3")
            except OSError:
                pass
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            self.parent_procs = root / "cgroup.procs"
        else:
            raise RuntimeError("no cgroup memory controller (v2 or v1) on this host")
        return self

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    @contextlib.contextmanager
    def joined(self):
        """Run the body with this process inside the cgroup, so that children it starts
        (a packfs daemon, an object server) are born there; leave it afterwards."""
        self.add(os.getpid())
        try:
            yield self
        finally:
            self.parent_procs.write_text(str(os.getpid()))

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def usage(self) -> int:
        f = "memory.current" if self.kind == "v2" else "memory.usage_in_bytes"
        try:
            return int((self.path / f).read_text())
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        try:
            if self.kind == "v2":
                for line in (self.path / "memory.events").read_text().splitlines():
                    k, v = line.split()
                    if k == "oom_kill":
                        return int(v)
            else:
                for line in (self.path / "memory.oom_control").read_text().splitlines():
                    k, v = line.split()
                    if k == "oom_kill":
                        return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def __exit__(self, *exc) -> None:
        if not self.path:
            return
        # move everything back to the parent, then remove the group
        for _ in range(3):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            if not pids:
                break
            for p in pids:
                try:
                    self.parent_procs.write_text(str(p))
                except OSError:
                    pass
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        log(f"cgroup: could not remove {self.path}")


def preexec_join(procs_file: str):
    """A preexec_fn that puts the child into the cgroup before it runs anything."""
    def fn():
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
    return fn
