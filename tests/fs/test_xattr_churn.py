"""noxattrs_in_memory under churn, through a real mount: getxattrs read checkpointed values
in worker threads while other threads change values, replace files (their inode numbers
are reused, the last freed first) and force checkpoints. No read may ever return another
file's value, or a value older than one the same reader has already seen, or fail.

It found a getxattr failing with EIO (in about a third of runs): a worker thread that
opened another catalog reader asked the first connection for its file name while a
checkpoint was using it in another thread (tests/unit/test_catalog.py has the exact case)."""
from __future__ import annotations

import errno
import os
import random
import threading
import time

from fsutil import repeat_concurrently
from mounts import mounted

from packfs.fuse import control
from packfs.core import pack

FILES = 400  # more than the 256 values the daemon keeps once read, so reads go to the catalog
SECONDS = 4.0
KEY = "user.swift.metadata"


def _value(name: str, version: int) -> bytes:
    # sizes from 40 to ~400 B, so some values are stored compressed and some plain
    return f"{name}:{version}:".encode() + bytes(random.Random(name).randrange(40, 400))


def _parse(value: bytes) -> tuple[str, int]:
    name, version, _ = value.split(b":", 2)
    return name.decode(), int(version)


def test_checkpointed_xattrs_read_in_worker_threads_stay_right_under_churn(tmp_path):
    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrs_in_memory") as work:
        pack_id = pack.read_marker(str(tmp_path / "pack"))["pack_id"]
        lock = threading.Lock()
        latest: dict[str, int] = {}  # live file name -> version last set (under lock)
        serial = iter(range(10**9))

        def pick(rng: random.Random) -> str:
            with lock:
                names = list(latest)
            return rng.choice(names)

        def make_file() -> None:
            name = f"f{next(serial)}"
            with open(work / name, "wb"):
                pass
            os.setxattr(work / name, KEY, _value(name, 0))
            with lock:
                latest[name] = 0

        for _ in range(FILES):
            make_file()
        assert control.request(pack_id, "sync") == {"ok": True}
        assert control.request(pack_id, "stats")["xattr_values_in_memory"] == 0

        failures: list[str] = []  # wrong values read (a step that raises ends the run)
        counts = {"reads": 0, "sets": 0, "replaced": 0, "checkpoints": 0}

        def reader_loop():
            seen: dict[str, int] = {}
            rng = random.Random()

            def read() -> None:
                name = pick(rng)
                try:
                    got = os.getxattr(work / name, KEY)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ENODATA):  # replaced meanwhile
                        return
                    raise
                owner, version = _parse(got)
                if owner != name:
                    failures.append(f"{name} read {owner}'s value")
                elif version < seen.get(name, -1):
                    failures.append(f"{name} read version {version} after {seen[name]}")
                elif got != _value(name, version):
                    failures.append(f"{name} read damaged bytes")
                seen[name] = max(version, seen.get(name, -1))
                counts["reads"] += 1
            return read

        setter_rng, replacer_rng = random.Random(), random.Random()

        def set_value() -> None:
            name = pick(setter_rng)
            with lock:
                if name not in latest:
                    return
                version = latest[name] + 1
                os.setxattr(work / name, KEY, _value(name, version))
                latest[name] = version
            counts["sets"] += 1

        def replace_file() -> None:
            name = pick(replacer_rng)
            with lock:
                if name not in latest:
                    return
                del latest[name]
                os.unlink(work / name)
            make_file()
            counts["replaced"] += 1

        def checkpoint() -> None:
            assert control.request(pack_id, "sync") == {"ok": True}
            counts["checkpoints"] += 1
            time.sleep(0.005)

        steps = {f"reader{i}": reader_loop() for i in range(4)}
        steps |= {"set_value": set_value, "replace_file": replace_file, "checkpoint": checkpoint}

        def enough() -> bool:
            return (counts["checkpoints"] >= 10 and counts["replaced"] >= 50 and counts["sets"] >= 50
                    and counts["reads"] >= 500)

        failures += repeat_concurrently(steps, SECONDS, enough)
        assert not failures, failures[:10]
        assert enough(), counts

        for name, version in latest.items():
            assert os.getxattr(work / name, KEY) == _value(name, version)
    with mounted(tmp_path / "pack", tmp_path / "mnt", "noxattrs_in_memory") as work:
        for name, version in latest.items():
            assert os.getxattr(work / name, KEY) == _value(name, version)
        assert sorted(os.listdir(work)) == sorted(latest)
