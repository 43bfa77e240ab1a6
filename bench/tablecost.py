"""`python -m bench.tablecost [--objects N | --tree PATH] [--catalog] [--json FILE]`: what
the inode table costs per stored file, by part (issue 56: at most 64 B of RAM per object).

Why: the table's memory is its columns, its arenas and a few dicts, each sized by its own
rule (per slot, per name, per xattr blob, per rare case); a daemon's RSS says only their
sum. This says which part holds how many bytes per file, so that a change of shape can be
judged by the bytes it would take away.

How: the table is built as a real mount builds it, without FUSE. A Swift device tree of
N objects (`objects/<part>/<suffix>/<hash>/<ts>.data` of 64 B with the metadata xattrs of
Swift's own write_metadata, made as bench/scale.py makes its trees) is built in a
temporary directory, or the tree at --tree is taken as it is (/usr: the non-Swift case);
`packfs import` makes a pack of it in another process; then this process opens the pack
as a mount does (pack.open_pack: the namespace image the import left, or with --catalog
the catalog, as after a crash) and sizes every attribute of the inode table and of its
namespace. A part is one attribute, named after it (`ns.` for the namespace's): the
bytes of every object it reaches, each object once (sys.getsizeof, rounded up to
pymalloc's 16 B below 512 B; an array or bytearray counts what it has allocated, a dict
its keys and values; small ints, functions and attribute names count nothing: they are
shared). The whole namespace is then sized again in one walk, which the parts must add
up to. The process's RSS grown by the open (after a collection and malloc_trim, as the
daemon trims after its load) is shown beside it: the table plus the catalog's and the
volumes' own.

Prints a markdown table, parts by size, in bytes per file (a regular file: a Swift
object) and per inode; --json writes every figure with the date, commit and command.
Everything made goes under /tmp/tablecost-* (or --work) and is removed at the end.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .scale import build_objects
from .util import REPO, log, rss_bytes

if TYPE_CHECKING:
    from packfs.namespace.namespace import Namespace

_SHARED = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.LambdaType, type,
           types.ModuleType, bool, type(None))
_LEAVES = (int, float, str, bytes, bytearray, array, memoryview)
# What a few parts hold (the rest are described by their type and length).
NOTES = {
    "kind": "column: kind number, a (mode, uid, gid, nlink) in `kinds`",
    "size": "column: a file's size, a directory's parent",
    "mtime": "column: mtime in ns",
    "kid": "column: a directory's one child; a file's xattr reference",
    "kname": "column: a directory's one name (in `names`); a file's one whole record",
    "lookups": "column: the kernel's references (a running mount's)",
    "atimes": "column: distance before mtime, and far times beside it",
    "ctimes": "column: distance after mtime, and far times beside it",
    "names": "arena: the names kept in directory slots (one, or a few packed)",
    "dirs": "dict: entries of directories with many names (packed, or dicts)",
    "xblobs": "arena: each inode's xattrs, one packed blob (compressed unless `plain`)",
    "dir_xat": "dict: directories' xattr references",
    "extents": "dict: extent maps not held whole in `kname`",
    "target": "dict: symlink targets",
    "ns.refs": "dict: records more than one extent maps",
}
SMALL_PART = 0.05  # B/file: parts below this share one line of the markdown table (the JSON has each)


def _alloc(n: int) -> int:
    """Bytes an object of sys.getsizeof n takes: pymalloc's 16 B steps up to 512 B."""
    return n + (-n % 16) if n <= 512 else n


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of obj and of every object it reaches that `seen` has not (which it adds)."""
    total, todo = 0, [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, _SHARED) or (type(o) is int and -5 <= o <= 256) or id(o) in seen:
            continue
        seen.add(id(o))
        total += _alloc(sys.getsizeof(o))
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo.extend(o)
        elif not isinstance(o, _LEAVES):
            attrs = getattr(o, "__dict__", None)
            if attrs is not None and id(attrs) not in seen:  # (its keys are attribute names: the class's)
                seen.add(id(attrs))
                total += _alloc(sys.getsizeof(attrs))
                todo.extend(attrs.values())
            todo.extend(getattr(o, s) for c in type(o).__mro__ for s in getattr(c, "__slots__", ())
                        if s != "__dict__" and hasattr(o, s))
    return total


def parts(ns: Namespace) -> dict[str, int]:
    """Bytes of each attribute of the inode table and of the namespace (`ns.`), and of the
    two objects themselves, each object counted in the first part that reaches it."""
    t = ns.table
    seen = {id(ns), id(vars(ns)), id(t), id(vars(t))}
    out = {"ns": _alloc(sys.getsizeof(ns)) + _alloc(sys.getsizeof(vars(ns))),
           "table": _alloc(sys.getsizeof(t)) + _alloc(sys.getsizeof(vars(t)))}
    for name, value in vars(t).items():
        out[name] = deep_size(value, seen)
    for name, value in vars(ns).items():
        out["ns." + name] = deep_size(value, seen)
    return out


def _describe(name: str, value: Any) -> str:
    what = NOTES.get(name, "")
    if isinstance(value, array):
        shape = f"array '{value.typecode}' of {len(value):,}"
    elif hasattr(value, "data") and isinstance(value.data, bytearray):
        shape = f"{len(value.data):,} B, {value.wasted():,} free"
    elif hasattr(value, "column"):
        shape = f"array '{value.column.typecode}', {value.far_count():,} far"
    elif hasattr(value, "__len__"):
        shape = f"{type(value).__name__} of {len(value):,}"
    else:
        shape = type(value).__name__
    return f"{what} ({shape})" if what else shape


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(packdir: Path, from_catalog: bool = False) -> dict:
    """Open the pack as a mount does and size its table: parts, total, counts, RSS grown."""
    from packfs.core import pack
    from packfs.namespace import image
    from packfs.namespace.xattrblob import compressible
    from packfs.namespace.xattrstore import IN_RECORD
    from packfs.options import Options
    from packfs.store.disk import Disk
    if from_catalog:
        image.discard(str(packdir))
    opts = Options()
    _trim()
    rss0 = rss_bytes(os.getpid())
    p = pack.open_pack(str(packdir), Disk(), opts.volume_size, opts.cache_size, opts.xattrs_in_memory)
    try:
        _trim()
        rss = rss_bytes(os.getpid()) - rss0
        t = p.ns.table
        sizes = parts(p.ns)
        total = deep_size(p.ns, set())
        files = t.of_type(stat.S_IFREG).count(1)
        dirs = t.of_type(stat.S_IFDIR).count(1)
        blobs = [t.xblobs.get(ref) for ref in itertools.compress(t.kid, t.not_dirs()) if ref > IN_RECORD]
        blobs += [t.xblobs.get(ref) for ref in t.dir_xat.values() if ref > IN_RECORD]
        in_records = t.xattrs_in_records()
        plain = sum(map(compressible, blobs))
        notes = {name: _describe(name, getattr(p.ns, name[3:]) if name.startswith("ns.") else getattr(t, name))
                 for name in sizes if name not in ("ns", "table")}
        notes["xblobs"] += (f"; {plain:,} of {len(blobs):,} blobs plain, {sum(map(len, blobs)):,} B in all; "
                            f"{in_records:,} files' xattrs in their records instead")
        return {"loaded_from": p.loaded_from, "files": files, "directories": dirs, "inodes": len(t),
                "slots": len(t.kind), "parts": sizes, "notes": notes, "total": total, "rss_grown": rss,
                "xattr_blobs": len(blobs), "xattr_blobs_plain": plain, "xattrs_in_records": in_records}
    finally:
        p.volumes.close()
        p.catalog.close()


def run(source: Path, packdir: Path, from_catalog: bool = False) -> dict:
    """Import source into packdir (another process, as `packfs import`), then measure it."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "packfs.cli", "import", str(source), str(packdir)], cwd=REPO,
                   stdout=subprocess.DEVNULL, check=True)
    log(f"tablecost: imported {source} in {time.monotonic() - t0:.1f} s")
    return measure(packdir, from_catalog)


def markdown(r: dict) -> str:
    files, inodes = max(r["files"], 1), max(r["inodes"], 1)
    lines = [f"{r['files']:,} files, {r['directories']:,} directories, {r['inodes']:,} inodes "
             f"({r['inodes'] / files:.2f} per file), {r['slots']:,} slots; table loaded from the {r['loaded_from']}",
             "", "| part | B/file | B/inode | share | what |", "|---|---:|---:|---:|---|"]
    ranked = sorted(r["parts"].items(), key=lambda kv: -kv[1])
    small = [(name, n) for name, n in ranked if n / files < SMALL_PART]
    rows = [(name, n, r["notes"].get(name, "the object itself")) for name, n in ranked if n / files >= SMALL_PART]
    rows.append((f"{len(small)} others", sum(n for _, n in small), ", ".join(name for name, n in small if n)))
    for name, n, what in rows:
        lines.append(f"| {name} | {n / files:.2f} | {n / inodes:.2f} | {100 * n / max(r['total'], 1):.1f}% | {what} |")
    lines += [f"| **total** | **{r['total'] / files:.2f}** | **{r['total'] / inodes:.2f}** | 100% | "
              f"one walk of the whole namespace; the parts add up to {sum(r['parts'].values()):,} B of "
              f"{r['total']:,} |", "",
              f"Process RSS grown by opening the pack: {r['rss_grown'] / files:.1f} B per file "
              f"({r['rss_grown'] / 2**20:,.1f} MiB)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tablecost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=100_000, help="Swift objects to build (without --tree)")
    ap.add_argument("--tree", type=Path, help="import this directory as it is instead (e.g. /usr)")
    ap.add_argument("--catalog", action="store_true", help="load the table from the catalog, not the image")
    ap.add_argument("--work", type=Path, help="where the tree and the pack go (default a new /tmp/tablecost-*)")
    ap.add_argument("--json", type=Path, help="write every figure here as JSON")
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="tablecost-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source = a.tree
        if source is None:
            source = work / "source"
            log(f"tablecost: building {a.objects:,} Swift objects in {source}")
            build_objects(str(source), 0, a.objects, 64, f"{time.time() - 3600:016.5f}", "source")
        r = run(source, work / "pack", a.catalog)
    finally:
        shutil.rmtree(work / "pack", ignore_errors=True)
        if a.tree is None:
            shutil.rmtree(work / "source", ignore_errors=True)
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    r = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
         "command": " ".join(["python -m bench.tablecost", *(argv if argv is not None else sys.argv[1:])]),
         "source": str(a.tree or f"{a.objects:,} Swift objects of 64 B"), **r,
         "per_file": {k: round(v / max(r["files"], 1), 3) for k, v in r["parts"].items()}}
    print(f"{r['date']}, commit {commit}, `{r['command']}`: {r['source']}\n")
    print(markdown(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
