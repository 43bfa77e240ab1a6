"""Mixed file operations from many threads at once, through a real mount, while other
threads force checkpoints and ask for `packfs stats` (both work through the inode table
a part at a time, between requests). Each worker owns a directory and keeps a model of
it; every read is checked against the model, and so is the whole tree at the end and
after a remount."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from fsutil import repeat_concurrently
from mounts import mounted

from packfs.fuse import control
from packfs.core import pack

WORKERS = 6
SECONDS = 5.0
KEY = "user.swift.metadata"


class Worker:
    """Random operations on files of its own directory, checked against a model of it."""

    def __init__(self, root: Path, n: int) -> None:
        self.dir = root / f"w{n}"
        self.rng = random.Random(n)
        self.files: dict[str, tuple[bytearray, bytes]] = {}  # name -> (contents, xattr value)
        self.serial = 0
        self.ops = 0
        os.makedirs(self.dir / "sub")

    def step(self) -> None:
        rng = self.rng
        names = list(self.files)
        op = rng.choice(["create", "create", "write", "truncate", "rename", "unlink", "read", "read"]
                        if names else ["create"])
        name = rng.choice(names) if names else ""
        path = self.dir / name
        if op == "create":
            self.serial += 1
            new = f"sub/f{self.serial}" if rng.random() < 0.3 else f"f{self.serial}"
            data = bytearray(rng.randbytes(rng.choice([0, 100, 4096, 4049, 65536 + 7, 300_000])))
            fd = os.open(self.dir / new, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                for pos in range(0, len(data), 65536):
                    os.write(fd, data[pos:pos + 65536])
                value = f"{new}:{self.serial}".encode() * rng.randrange(1, 20)
                os.setxattr(fd, KEY, value)
                if rng.random() < 0.5:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self.files[new] = (data, value)
        elif op == "write":
            data, value = self.files[name]
            at = rng.randrange(0, len(data) + 5000)
            piece = rng.randbytes(rng.choice([1, 512, 8192, 70_000]))
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(piece)
                if rng.random() < 0.3:
                    os.fsync(f.fileno())
            if at > len(data):
                data.extend(bytes(at - len(data)))
            data[at:at + len(piece)] = piece
        elif op == "truncate":
            data, _ = self.files[name]
            size = rng.randrange(0, len(data) + 10_000)
            os.truncate(path, size)
            del data[size:]
            data.extend(bytes(size - len(data)))
        elif op == "rename":
            self.serial += 1
            new = f"sub/r{self.serial}" if name.startswith("f") else f"r{self.serial}"
            os.rename(path, self.dir / new)
            self.files[new] = self.files.pop(name)
        elif op == "unlink":
            os.unlink(path)
            del self.files[name]
        else:
            self.check(name)
        self.ops += 1

    def check(self, name: str) -> None:
        data, value = self.files[name]
        with open(self.dir / name, "rb") as f:
            got = f.read()
        assert got == data, f"{self.dir.name}/{name}: {len(got)} bytes read, the model has {len(data)}"
        assert os.getxattr(self.dir / name, KEY) == value, f"{self.dir.name}/{name}: xattr"

    def check_all(self) -> None:
        listed = {n for n in os.listdir(self.dir) if n != "sub"} | {f"sub/{n}" for n in os.listdir(self.dir / "sub")}
        assert listed == set(self.files), f"{self.dir.name}: the listing differs from the model"
        for name in self.files:
            self.check(name)


@pytest.mark.parametrize("options", ["", "xattrs_in_memory"])
def test_mixed_operations_from_many_threads_during_checkpoints(tmp_path, options):
    with mounted(tmp_path / "pack", tmp_path / "mnt", options) as root:
        pack_id = pack.read_marker(str(tmp_path / "pack"))["pack_id"]
        workers = [Worker(root, n) for n in range(WORKERS)]
        checkpoints = [0]

        def checkpoint() -> None:
            assert control.request(pack_id, "sync") == {"ok": True}
            checkpoints[0] += 1
            time.sleep(0.01)

        def stats() -> None:
            s = control.request(pack_id, "stats")
            assert s["files"] >= 0 and "error" not in s, s
            time.sleep(0.05)

        def enough() -> bool:
            return checkpoints[0] >= 10 and all(w.ops >= 50 for w in workers)

        steps = {w.dir.name: w.step for w in workers} | {"checkpoint": checkpoint, "stats": stats}
        failures = repeat_concurrently(steps, SECONDS, enough)
        assert not failures, failures[:5]
        assert enough(), (checkpoints, [w.ops for w in workers])
        for w in workers:
            w.check_all()
    with mounted(tmp_path / "pack", tmp_path / "mnt", options):
        for w in workers:
            w.check_all()
