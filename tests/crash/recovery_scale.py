"""Recovery time after an unclean stop with a million files (a benchmark, not a test).

    python tests/crash/recovery_scale.py [--files 1000000] [--dir run/recovery-scale]
    make recovery-scale [RECOVERY_FILES=1000000]

Builds a pack through the core (packfs.core.filesystem, real Disk, default mount options) in
a Swift-like layout: FILES small objects of SIZE bytes, each with a user.swift.metadata
xattr, spread over directories, committed (fsync) every FSYNC_EVERY files -- a group
commit, as concurrent Swift PUTs give. Checkpoints happen where the default policy puts
them (every 200,000 changed inodes), timed so that the stop falls just before the next
one: the worst case replay the policy allows. Then the process stops without a
checkpoint, like kill -9 (what was written stays written; nothing more).

Recovery is then measured in a fresh process, as a mount does it: open_pack (catalog
load + journal replay + tail cut) and the post-recovery checkpoint; then once more
after that checkpoint (the clean-mount baseline). With --cold the page cache is dropped
first (root only).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import trio  # noqa: E402

from packfs.core import pack as packmod  # noqa: E402
from packfs.store.disk import Disk  # noqa: E402
from packfs.core.filesystem import Filesystem  # noqa: E402
from packfs.options import Options  # noqa: E402

CHECKPOINT_INODES = 200_000  # journal.commit's trigger


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def build(packdir: str, files: int, per_dir: int, size: int, xattr: int, fsync_every: int) -> dict:
    opts = Options()
    disk = Disk()
    packmod.initialise(packdir, disk)
    body = os.urandom(size)
    meta = os.urandom(xattr)
    final = min(files, CHECKPOINT_INODES - 2 * fsync_every)  # files since the last checkpoint at the stop
    checkpoints_at = set(range(files - final, 0, -CHECKPOINT_INODES))
    t0 = time.monotonic()
    out: dict = {}

    async def main() -> None:
        pk = packmod.open_pack(packdir, disk, opts.volume_size, opts.cache_size)
        fs = Filesystem(pk, opts, disk)
        fs.journal.checkpoint_bytes = 1 << 62  # checkpoints are placed by hand, where the policy would
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.volumes.run)
            d = None
            for i in range(files):
                if i % per_dir == 0:
                    top = fs.lookup(1, b"objects") or fs.create(1, b"objects", stat.S_IFDIR | 0o755, 0, 0)
                    d = fs.create(top.ino, f"{i // per_dir:06x}".encode(), stat.S_IFDIR | 0o755, 0, 0)
                node = fs.create(d.ino, f"{i:032x}.data".encode(), stat.S_IFREG | 0o644, 0, 0)
                fh = fs.open(node.ino)
                await fs.write(fh, 0, body)
                fs.setxattr(node.ino, b"user.swift.metadata", meta)
                await fs.release(fh)
                if (i + 1) % fsync_every == 0:
                    await fs.fsync()
                if i + 1 in checkpoints_at:
                    await fs.journal.checkpoint()
                if (i + 1) % 100_000 == 0:
                    print(f"  {i + 1:,} files, {time.monotonic() - t0:.0f} s, {fs.volumes.appended >> 20} MiB of log",
                          flush=True)
            await fs.fsync()
            out["log_since_checkpoint"] = fs.volumes.appended - fs.journal._appended_at_checkpoint
            out["checkpoints"] = fs.journal.checkpoints
            nursery.cancel_scope.cancel()  # the unclean stop: no final checkpoint
        pk.volumes.close()
        pk.catalog.close()

    trio.run(main)
    out["build_seconds"] = time.monotonic() - t0
    out["files_since_checkpoint"] = final
    return out


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def measure(packdir: str) -> dict:
    """Run in a fresh process: what a mount does, timed."""
    opts = Options()
    disk = Disk()
    t0 = time.monotonic()
    pk = packmod.open_pack(packdir, disk, opts.volume_size, opts.cache_size)
    opened = time.monotonic() - t0
    out = {"open_pack_seconds": round(opened, 2), "replay_seconds": round(pk.recovery.seconds, 2),
           "catalog_load_seconds": round(opened - pk.recovery.seconds, 2),
           "replayed_commits": pk.recovery.replayed, "inodes": len(pk.ns),
           "truncated_bytes": pk.recovery.truncated_bytes}

    async def start() -> None:
        fs = Filesystem(pk, opts, disk)
        t1 = time.monotonic()
        async with trio.open_nursery() as nursery:
            await fs.start(nursery)
            await fs.journal.checkpoint()  # after the one start asked for, in the background
            out["post_recovery_checkpoint_seconds"] = round(time.monotonic() - t1, 2)
            nursery.cancel_scope.cancel()

    trio.run(start)
    out["total_seconds"] = round(time.monotonic() - t0, 2)
    out["rss_mib"] = round(rss() / 2**20)
    pk.volumes.close()
    pk.catalog.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--per-dir", type=int, default=1000)
    p.add_argument("--size", type=int, default=100, help="bytes per object")
    p.add_argument("--xattr", type=int, default=250, help="bytes of user.swift.metadata per object")
    p.add_argument("--fsync-every", type=int, default=100, help="files per commit (group commit)")
    p.add_argument("--dir", default="run/recovery-scale", help="work directory (its pack is replaced)")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each measurement (root)")
    p.add_argument("--keep", action="store_true", help="keep the pack, and a copy of it as the unclean stop left "
                   "it (pack.unclean), for --remeasure")
    p.add_argument("--remeasure", action="store_true", help="measure again from the kept pack.unclean, no build")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure)))
        return 0
    packdir = os.path.abspath(os.path.join(a.dir, "pack"))
    unclean = packdir + ".unclean"
    shutil.rmtree(packdir, ignore_errors=True)
    os.makedirs(os.path.dirname(packdir), exist_ok=True)
    if a.remeasure:
        subprocess.run(["cp", "-a", "--sparse=always", unclean, packdir], check=True)
        a.keep = True
    else:
        shutil.rmtree(unclean, ignore_errors=True)
        print(f"building {a.files:,} files in {packdir} ...", flush=True)
        built = build(packdir, a.files, a.per_dir, a.size, a.xattr, a.fsync_every)
        print(f"built in {built['build_seconds']:.0f} s; unclean stop with {built['files_since_checkpoint']:,} "
              f"files ({built['log_since_checkpoint'] >> 20} MiB of log) since the last checkpoint", flush=True)
        if a.keep:
            subprocess.run(["cp", "-a", "--sparse=always", packdir, unclean], check=True)
    results = {}
    for label in ("after the unclean stop", "after the post-recovery checkpoint (clean mount)"):
        cold = a.cold and drop_caches()
        r = subprocess.run([sys.executable, __file__, "--measure", packdir], capture_output=True, text=True,
                           check=True)
        m = json.loads(r.stdout.strip().splitlines()[-1])
        m["cold_cache"] = cold
        results[label] = m
        print(f"recovery {label}: {json.dumps(m)}", flush=True)
    pack_bytes = sum(f.stat().st_blocks * 512 for f in Path(packdir).rglob("*") if f.is_file())
    print(f"pack on disk: {pack_bytes >> 20} MiB")
    first = results["after the unclean stop"]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"SUMMARY: {first['inodes']:,} inodes; recovery after an unclean stop: {first['total_seconds']} s "
          f"(catalog load {first['catalog_load_seconds']} s, replay of {first['replayed_commits']:,} commits "
          f"{first['replay_seconds']} s, post-recovery checkpoint {first['post_recovery_checkpoint_seconds']} s, "
          f"RSS {first['rss_mib']} MiB); clean mount: "
          f"{results['after the post-recovery checkpoint (clean mount)']['total_seconds']} s")
    if not a.keep:
        shutil.rmtree(packdir, ignore_errors=True)
        shutil.rmtree(unclean, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
