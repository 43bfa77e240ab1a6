"""The filesystems under test, created and destroyed by the benchmark itself.

Each run gets fresh filesystems on sparse image files in the bench work directory
(default /var/tmp/packfs-bench, on the machine's local disk):

- ``xfs``  : an XFS image on a loop device, mounted at  WORK/srv/xfs/sdb1
- ``ext4`` : an ext4 image on a loop device, mounted at WORK/srv/ext4/sdb1
- ``packfs``: a packfs mount at WORK/srv/packfs/sdb1 whose PACKDIR lives on an XFS
  image of its own (WORK/backing/pack).  The backing store is a loop device of the same
  kind as the XFS under test, so that space, drop_caches and fsync costs are
  comparable: every byte packfs writes goes through the same loop/XFS/host-disk path
  as the XFS it is compared with.  (BENCH_PACKFS_BACKING=ext4 switches it.)

Loop devices use ``--direct-io=on`` so that the image file is not cached a second time
in the host page cache and an fsync reaches the virtual disk.  Everything is unmounted
and detached in ``finally`` blocks, and stale state from an interrupted earlier run is
cleaned up before starting.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .diskmodel import release
from .util import REPO, log, run

sys.path.insert(0, str(REPO / "tests"))
import mounts  # noqa: E402  (tests/mounts.py: mount, umount, force_unmount, kill9)

FS_ORDER = ("packfs", "xfs", "ext4")
DEVICE = "sdb1"


def packfs_available() -> bool:
    try:
        p = subprocess.run([*mounts.PACKFS, "mount", "--help"], capture_output=True, timeout=60, cwd=REPO)
        return p.returncode == 0
    except Exception:
        return False


@dataclass
class Target:
    name: str
    devices: Path            # Swift's `devices` directory
    mnt: Path                # devices/sdb1: the filesystem under test
    img: Path | None = None  # image of the filesystem (xfs/ext4) or of packfs's backing store
    loop: str | None = None
    backing_mnt: Path | None = None
    packdir: Path | None = None
    mkfs: list = field(default_factory=list)
    mount_opts: str = "noatime"
    packfs_opts: str = ""

    @property
    def is_packfs(self) -> bool:
        return self.name == "packfs"

    def daemon_pid(self) -> int | None:
        return mounts.daemon_pid(self.packdir) if self.packdir else None

    def pids(self) -> list[int]:
        """Processes that belong to the filesystem (to be put in a cgroup with Swift)."""
        pid = self.daemon_pid()
        return [pid] if pid else []

    # -- mounting the filesystem under test (not the backing store) --
    def mount(self) -> float:
        """Mount the filesystem under test; returns the seconds it took."""
        self.mnt.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if self.is_packfs:
            mounts.mount(self.packdir, self.mnt, self.packfs_opts)
        else:
            run(["mount", "-o", self.mount_opts, self.loop, self.mnt])
        return time.monotonic() - t0

    def umount(self) -> float:
        t0 = time.monotonic()
        if self.is_packfs:
            try:
                mounts.umount(self.packdir, self.mnt)
            except Exception:
                mounts.force_unmount(self.mnt, self.packdir)
                raise
        else:
            run(["umount", self.mnt])
        return time.monotonic() - t0

    def is_mounted(self) -> bool:
        return mounts.is_mounted(self.mnt)

    def kill9(self) -> None:
        mounts.kill9(self.packdir, self.mnt)

    def stats(self) -> dict | None:
        """`packfs stats MOUNTPOINT --json`, or None for other filesystems."""
        if not self.is_packfs:
            return None
        import json
        p = run([*mounts.PACKFS, "stats", self.mnt, "--json"], timeout=60, cwd=REPO)
        return json.loads(p.stdout)


def _mounted_under(root: Path) -> list[tuple[str, str]]:
    root_s = os.path.realpath(root)
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mp = parts[1].replace("\\040", " ")
            if mp == root_s or mp.startswith(root_s + "/"):
                out.append((mp, parts[2]))
    return out


def _detach_loops_of(img: Path) -> None:
    p = run(["losetup", "-j", img], check=False)
    for line in p.stdout.splitlines():
        dev = line.split(":", 1)[0]
        if dev.startswith("/dev/loop"):
            release(dev)
            run(["losetup", "-d", dev], check=False)


class Testbed:
    """Create, mount and always tear down the filesystems of one benchmark part."""

    def __init__(self, work: Path, size_gib: int, fs_names=FS_ORDER, packfs_opts: str = "",
                 backing: str = "xfs", ext4_inodes: int | None = None):
        self.work = work
        self.size_gib = size_gib
        self.fs_names = list(fs_names)
        self.packfs_opts = packfs_opts
        self.backing = backing
        self.ext4_inodes = ext4_inodes
        self.targets: dict[str, Target] = {}

    # ---------------------------------------------------------------- setup
    def __enter__(self) -> "Testbed":
        cleanup_stale(self.work)
        try:
            for name in self.fs_names:
                self.targets[name] = self._create(name)
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def __iter__(self):
        return iter(self.targets.values())

    def _mkfs_cmd(self, kind: str, dev: str) -> list:
        if kind == "xfs":
            return ["mkfs.xfs", "-q", "-f", dev]
        cmd = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]
        if self.ext4_inodes:
            cmd += ["-N", str(self.ext4_inodes)]
        return cmd + [dev]

    def _loop_fs(self, kind: str, img: Path) -> str:
        img.parent.mkdir(parents=True, exist_ok=True)
        if img.exists():
            img.unlink()
        with open(img, "wb") as f:
            f.truncate(self.size_gib << 30)
        loop = run(["losetup", "--find", "--show", "--direct-io=on", img]).stdout.strip()
        run(self._mkfs_cmd(kind, loop))
        return loop

    def _create(self, name: str) -> Target:
        devices = self.work / "srv" / name
        t = Target(name=name, devices=devices, mnt=devices / DEVICE)
        self.targets[name] = t  # registered first so that teardown sees it
        if name == "packfs":
            t.img = self.work / "img" / f"packfs-backing-{self.backing}.img"
            t.loop = self._loop_fs(self.backing, t.img)
            t.backing_mnt = self.work / "backing"
            t.backing_mnt.mkdir(parents=True, exist_ok=True)
            run(["mount", "-o", "noatime", t.loop, t.backing_mnt])
            t.packdir = t.backing_mnt / "pack"
            t.packdir.mkdir()
            # noatime, as XFS and ext4 are mounted here and as Swift devices should be
            t.packfs_opts = ",".join(filter(None, ("noatime", self.packfs_opts)))
        else:
            t.img = self.work / "img" / f"{name}.img"
            t.loop = self._loop_fs(name, t.img)
        t.mount()
        log(f"testbed: {name} mounted at {t.mnt} ({t.loop}, {t.img.name})")
        return t

    # ------------------------------------------------------------- teardown
    def teardown(self) -> None:
        for t in reversed(list(self.targets.values())):
            try:
                if t.is_packfs:
                    if t.is_mounted():
                        try:
                            t.umount()
                        except Exception as e:  # noqa: BLE001
                            log(f"testbed: packfs clean unmount failed ({e}); forced")
                            mounts.force_unmount(t.mnt, t.packdir)
                    else:
                        mounts.force_unmount(t.mnt, t.packdir)
                    if t.backing_mnt and mounts.is_mounted(t.backing_mnt):
                        run(["umount", t.backing_mnt], check=False)
                elif t.is_mounted():
                    if run(["umount", t.mnt], check=False).returncode:
                        run(["umount", "-l", t.mnt], check=False)
            finally:
                if t.loop:
                    run(["losetup", "-d", t.loop], check=False)
                if t.img and t.img.exists():
                    t.img.unlink()
        self.targets.clear()


def cleanup_stale(work: Path) -> None:
    """Undo whatever an interrupted earlier run left under WORK: mounts, loops (their
    throttle rules too), images. Another run's devices, under another WORK, stay alone."""
    work.mkdir(parents=True, exist_ok=True)
    for mp, fstype in sorted(_mounted_under(work), key=lambda m: -len(m[0])):
        log(f"cleanup: stale mount {mp} ({fstype})")
        if fstype.startswith("fuse"):
            packdir = work / "backing" / "pack"
            mounts.force_unmount(Path(mp), packdir if packdir.exists() else None)
        else:
            if run(["umount", mp], check=False).returncode:
                run(["umount", "-l", mp], check=False)
    imgdir = work / "img"
    if imgdir.exists():
        for img in imgdir.glob("*.img"):
            _detach_loops_of(img)
            img.unlink()
    for sub in ("srv", "backing"):
        d = work / sub
        if d.exists() and not _mounted_under(d):
            shutil.rmtree(d, ignore_errors=True)
