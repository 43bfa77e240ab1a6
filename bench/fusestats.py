"""FUSE requests per Swift operation, from `packfs stats MOUNTPOINT --json` diffs.

The stats document is searched for the per-request-type table: a mapping from FUSE
request names (lookup, getattr, write, ...) to either a count or an object with a
count field.  That keeps this tolerant of the exact layout the CLI chooses.
"""
from __future__ import annotations

from packfs.stats import ANSWERED_IN_SHIM

FUSE_OPS = {
    "lookup", "forget", "forget_multi", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink",
    "rmdir", "symlink", "rename", "link", "open", "read", "write", "flush", "release", "fsync",
    "opendir", "readdir", "readdirplus", "releasedir", "fsyncdir", "statfs", "setxattr", "getxattr",
    "listxattr", "removexattr", "access", "create", "fallocate", "lseek", "copy_file_range", "ioctl",
    "poll", "bmap", "init", "destroy", "interrupt",
}
COUNT_FIELDS = ("count", "n", "calls", "requests", "ops")


def _count(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, dict):
        for f in COUNT_FIELDS:
            if isinstance(v.get(f), (int, float)) and not isinstance(v.get(f), bool):
                return v[f]
    return None


def op_counts(stats) -> dict[str, float]:
    """The {request type: count} table found in a stats document."""
    best: dict[str, float] = {}

    def walk(node):
        nonlocal best
        if isinstance(node, dict):
            names = [k for k in node if isinstance(k, str) and k.lower() in FUSE_OPS]
            if len(names) >= 3:
                got = {k.lower(): _count(node[k]) for k in names}
                got = {k: v for k, v in got.items() if v is not None}
                if len(got) > len(best):
                    best = got
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            # a list of {"op": name, "count": n}
            rows = {}
            for item in node:
                if isinstance(item, dict):
                    name = item.get("op") or item.get("name") or item.get("request")
                    c = _count(item)
                    if isinstance(name, str) and name.lower() in FUSE_OPS and c is not None:
                        rows[name.lower()] = c
                walk(item)
            if len(rows) > len(best):
                best = rows

    walk(stats)
    # Requests the fuse shim answered itself (a listing's end, xattrs it was handed, an
    # ioctl) reach no handler, so the handlers' table lacks them; they are FUSE requests
    # all the same.
    for op, key in ANSWERED_IN_SHIM:
        shim = stats.get(key) if isinstance(stats, dict) else None
        if isinstance(shim, int) and shim:
            best[op] = best.get(op, 0) + shim
    return best


def request_table(per_op: dict) -> dict:
    """per_op: {"PUT": (stats_before, stats_after, n_ops), ...} -> a report table."""
    diffs = {}
    for op, (before, after, n) in per_op.items():
        b, a = op_counts(before), op_counts(after)
        diffs[op] = {k: (a.get(k, 0) - b.get(k, 0)) / n for k in set(a) | set(b) if n}
    kinds = sorted({k for d in diffs.values() for k, v in d.items() if v > 0},
                   key=lambda k: -sum(d.get(k, 0) for d in diffs.values()))
    ops = list(per_op)
    rows = [[k] + [round(diffs[o].get(k, 0.0), 2) for o in ops] for k in kinds]
    totals = {o: sum(v for v in diffs[o].values() if v > 0) for o in ops}
    rows.append(["**total**"] + [round(totals[o], 1) for o in ops])
    return {"title": "FUSE requests per Swift operation (packfs, 4 KiB objects, concurrency 1)",
            "note": "Differences of `packfs stats --json` request counts around "
                    + ", ".join(f"{per_op[o][2]} {o}s" for o in ops) + ", divided by the number of operations.",
            "columns": ["FUSE request"] + [f"per {o}" for o in ops], "rows": rows, "totals": totals}
