"""Mount helpers shared by every test and benchmark that needs a real packfs.

A mount made here is always unmounted, even when the test fails: `fusermount3 -u`
first, then a lazy unmount, and the daemon is stopped by its PID, never by name.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from packfs.stats import ANSWERED_IN_SHIM

PACKFS = [sys.executable, "-m", "packfs.cli"]


def is_mounted(mountpoint: Path) -> bool:
    target = os.path.realpath(mountpoint)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def daemon_pid(packdir: Path) -> int | None:
    try:
        return int((packdir / "daemon.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# Options every mount made here gets first, from the environment (PACKFS_TEST_OPTIONS=nometacache
# runs the fs tests with that part of the fuse shim off); a test's own come after and win.
TEST_OPTIONS = os.environ.get("PACKFS_TEST_OPTIONS", "")


def mount(packdir: Path, mountpoint: Path, options: str = "", check: bool = True) -> subprocess.CompletedProcess:
    args = [*PACKFS, "mount", str(packdir), str(mountpoint)]
    options = ",".join(o for o in (TEST_OPTIONS, options) if o)
    if options:
        args += ["-o", options]
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=120)


def stats(mountpoint: Path) -> dict:
    """`packfs stats --json` of a mount."""
    p = subprocess.run([*PACKFS, "stats", str(mountpoint), "--json"], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)


def requests_served(mountpoint: Path) -> dict[str, int]:
    """How many FUSE requests of each kind packfs's handlers have served."""
    return {op: v["count"] for op, v in stats(mountpoint)["operations"].items()}


def requests_received(mountpoint: Path) -> dict[str, int]:
    """How many FUSE requests of each kind the kernel sent the mount: those packfs's
    handlers served, and those its fuse shim answered in C (a listing's end, a getxattr
    of xattrs it was handed, an ioctl), which reach no handler."""
    s = stats(mountpoint)
    got = {op: v["count"] for op, v in s["operations"].items()}
    for op, in_shim in ANSWERED_IN_SHIM:
        got[op] = got.get(op, 0) + s[in_shim]
    return got


def force_unmount(mountpoint: Path, packdir: Path | None = None) -> None:
    """Tear a mount down whatever state it is in; used on test failure paths."""
    if is_mounted(mountpoint):
        if subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True).returncode:
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    pid = daemon_pid(packdir) if packdir else None
    if pid:
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def umount(packdir: Path, mountpoint: Path) -> None:
    """Clean unmount through the CLI: flush, checkpoint, wait for the daemon."""
    subprocess.run([*PACKFS, "umount", str(mountpoint)], check=True, capture_output=True, timeout=300)
    assert not is_mounted(mountpoint)


def kill_daemon(packdir: Path) -> None:
    """kill -9 the daemon (a crash, the OOM killer) and wait until it is gone; its mount
    stays behind, dead (ENOTCONN)."""
    pid = daemon_pid(packdir)
    assert pid, "no daemon pid"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def kill9(packdir: Path, mountpoint: Path) -> None:
    """Simulate a crash of the daemon, then clear the dead mount point."""
    kill_daemon(packdir)
    force_unmount(mountpoint)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as dead.
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return False
    return True


@contextlib.contextmanager
def mounted(packdir: Path, mountpoint: Path, options: str = "") -> Iterator[Path]:
    packdir.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    mount(packdir, mountpoint, options)
    try:
        yield mountpoint
    finally:
        if is_mounted(mountpoint):
            try:
                umount(packdir, mountpoint)
            except Exception:
                force_unmount(mountpoint, packdir)
                raise
