"""How long each part of a compaction of the xattr arena holds the event loop.

Builds an inode table (no FUSE, no disk) with N files, each with one incompressible
xattr value, replaces every value three times with one of another size (each freed run
fits no later value: the compaction comes due), then times InodeTable.compact_xattrs
part by part and prints the parts, their median and longest, and the whole, as JSON:

    python -m bench.compaction [--files 1000000] [--size 130]

`--whole` times the compaction in one part instead (all the slots, no byte budget), as
the daemon did it before it went in parts (docs/architecture.md, Memory).
"""
from __future__ import annotations

import argparse
import json
import random
import stat
import statistics
import time

from packfs.namespace import xattrstore
from packfs.namespace.namespace import ROOT, Namespace


def build(files: int, size: int) -> Namespace:
    ns = Namespace.fresh()
    rng = random.Random(1)
    d = ns.create(ROOT, b"d", stat.S_IFDIR | 0o755, 0, 0).ino
    inos = [ns.create(d, b"%032x" % i, stat.S_IFREG | 0o644, 0, 0).ino for i in range(files)]
    for n in (size * 2 // 5, size * 7 // 10, size * 2 // 5, size):  # the second 0.4 reuses the first's runs
        for ino in inos:
            ns.setxattr(ino, b"user.a", rng.randbytes(n))
    ns.table.compress_xattrs()
    return ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=130, help="bytes of each file's final value")
    ap.add_argument("--whole", action="store_true", help="one part: every slot, no byte budget")
    args = ap.parse_args()
    t = build(args.files, args.size).table
    xattrstore.XATTR_COMPACT_MIN = 0  # (due once the frees outweigh the values, however few)
    before = {"arena_mib": len(t.xblobs.data) / 2**20, "free_mib": t.xblobs.wasted() / 2**20}
    assert t.xattr_compaction_due(), before
    kwargs = {"slots": len(t.kind), "budget": 1 << 62} if args.whole else {}
    parts = []
    while True:
        started = time.perf_counter()
        more = t.compact_xattrs(**kwargs)
        parts.append(time.perf_counter() - started)
        if not more:
            break
    print(json.dumps({"files": args.files, **{k: round(v, 1) for k, v in before.items()},
                      "parts": len(parts), "median_ms": round(statistics.median(parts) * 1e3, 2),
                      "longest_ms": round(max(parts) * 1e3, 2), "longest_part": parts.index(max(parts)) + 1,
                      "total_s": round(sum(parts), 3), "free_after_mib": round(t.xblobs.wasted() / 2**20, 1)}))


if __name__ == "__main__":
    main()
