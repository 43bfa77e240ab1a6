"""`python -m bench.importrate WORKDIR [--objects N] [--size B] [--source DIR]`: how fast
`packfs import` makes a pack of a Swift device's tree.

The source is a device root in Swift's layout, `objects/<part>/<suffix>/<hash>/<ts>.data`
with the metadata xattrs Swift's object server writes, built as bench/scale.py builds its
trees (two processes, no fsync) in WORKDIR/source-N-B, or in --source, unless it is there
already. It is walked once (every file read, its xattrs listed) so that the import reads a
warm tree, then imported into WORKDIR/pack, which is removed first and after. Prints the
objects per second of the import's build (the tree made and checkpointed), its whole wall
and CPU time (its reader process's included) and its peak RSS (the larger process's).
The source stays for the next run: remove it when done.

--profile imports in this process under cProfile instead and prints where the builder's
time went, by the import's parts (cProfile slows the many small calls more than the few
large ones: shares, not times). The reader process, which reads the source, is not
profiled; the builder's time waiting for its batches falls in the event loop's, in none of
the parts.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .scale import build_objects
from .util import REPO, log


def warm(root: Path) -> int:
    """Read every file and list its xattrs once; the files read."""
    files = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                f.read()
            os.listxattr(path)
            files += 1
    return files


# The import's parts, as (file, function) whose cumulative time is the part's.
PARTS = {
    "taking the reader process's batches": [("importer/reader.py", "batches")],
    "Filesystem.create": [("core/filesystem.py", "create")],
    "Filesystem.write and the batches to the log writer": [("core/filesystem.py", "write"),
                                                            ("importer/build.py", "_write_batch")],
    "Filesystem.setxattrs": [("core/filesystem.py", "setxattrs")],
    "setting times": [("importer/build.py", "_times")],
    "checkpoints, on the loop (the catalog's writes run in a thread)": [("core/journal.py", "checkpoint")],
    "  of which compressing xattrs": [("namespace/xattrstore.py", "compress_xattrs")],
    "  of which snapshotting rows": [("core/journal.py", "snapshot")],
    "the check: reopen, compare, namespace image": [("importer/__init__.py", "_check")],
}


def profile(src: Path, pack: Path) -> None:
    """Import under cProfile; print each part's share of run_import's time."""
    from packfs.importer import run_import
    profiler = cProfile.Profile()
    files = profiler.runcall(run_import, str(src), str(pack)).tally.files
    cum: dict[tuple[str, str], float] = {}
    for (path, _, name), (_, _, _, total, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        key = (path.rsplit("/packfs/", 1)[-1], name)
        cum[key] = cum.get(key, 0.0) + total
    whole = cum[("importer/__init__.py", "run_import")]
    print(f"{files:,} objects, {whole:.1f} s in run_import under cProfile:")
    for part, funcs in PARTS.items():
        t = sum(cum.get(f, 0.0) for f in funcs)
        print(f"  {part:<66} {100 * t / whole:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.importrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="where the source tree (unless --source) and the pack go")
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=64, help="object size in bytes (64: seed 004's small objects)")
    ap.add_argument("--source", type=Path, help="the source tree's directory (default WORKDIR/source-N-B)")
    ap.add_argument("--profile", action="store_true", help="import under cProfile, print where the time went")
    a = ap.parse_args(argv)
    src = a.source or a.work / f"source-{a.objects}-{a.size}"
    if not (src / "objects").is_dir():
        log(f"importrate: building {a.objects:,} objects of {a.size} B in {src}")
        src.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        build_objects(str(src), 0, a.objects, a.size, f"{time.time() - 3600:016.5f}", "source")
        log(f"  built in {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    files = warm(src)
    log(f"importrate: {files:,} files walked and read in {time.monotonic() - t0:.1f} s (warm now)")
    pack = a.work / "pack"
    shutil.rmtree(pack, ignore_errors=True)
    if a.profile:
        profile(src, pack)
        shutil.rmtree(pack, ignore_errors=True)
        return 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "packfs.cli", "import", str(src), str(pack)], cwd=REPO,
                       stdout=subprocess.PIPE, text=True)  # (its progress lines pass on to stderr)
    wall = time.monotonic() - t0
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(pack, ignore_errors=True)
    if p.returncode:
        return 1
    built = float(re.search(r"checkpointed in ([\d,.]+) s", p.stdout).group(1).replace(",", ""))
    user, system = used.ru_utime - before.ru_utime, used.ru_stime - before.ru_stime
    print(f"{files:,} objects: {files / built:,.0f} objects/s (built and checkpointed in {built:.1f} s); "
          f"{wall:.1f} s wall and {user:.1f} s user + {system:.1f} s system CPU in all with the check; "
          f"peak RSS {used.ru_maxrss / 1024:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
