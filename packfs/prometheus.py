"""`packfs stats --prometheus`: the figures of `stats --json` in Prometheus's text format.

A pure function of the stats dict, so node_exporter's textfile collector can take a
mount's figures (mount/packfs-metrics@.service writes them every minute) with no
exporter process beside the daemon. The mapping, docs/stats.md gives the figures:

* every number is a sample named packfs_<field>, a nested one's path joined by `_`
  (`recovery.replayed`: packfs_recovery_replayed); those that only grow while a mount
  lasts (COUNTERS) are counters named ..._total, the rest gauges; a yes/no figure is a
  gauge of 1 or 0; a figure that is null (none yet) is left out;
* `broken` (null, or the error that stopped writes) is packfs_broken, 1 or 0;
* the text figures (version, pack directory, log writer, ...) are the labels of
  packfs_info, whose value is 1;
* `operations` and `device`, per request or device operation (label `op`): latency as a
  summary (p50 and p99, _sum, _count), and counters of errors and refusals.

Every sample has the labels `device` (the mount point's basename, Swift's device name)
and `mountpoint`.
"""
from __future__ import annotations

import os
from typing import Iterator

PREFIX = "packfs_"

# Fields that only grow while a mount lasts (they start at zero with it).
COUNTERS = frozenset({
    "punched_bytes", "appended_bytes", "device_writes", "device_flushes", "device_flushes_on_loop",
    "device_reads_waited", "prefetches", "commits", "checkpoints", "busy_poll_turns", "busy_poll_caught",
    "busy_poll_expired", "fuse_waits_skipped", "listing_ends_answered_in_shim", "xattrs_answered_in_shim",
    "ioctls_answered_in_shim", "opens_answered_in_shim", "releases_answered_in_shim", "lookups_answered_in_shim",
    "negative_lookups_answered_in_shim", "getattrs_answered_in_shim", "listings_answered_in_shim", "tmpfiles",
    "passthrough_staged", "passthrough_absorbed_bytes", "passthrough_refused", "passthrough_shared",
})
# Per-operation tables: the field, the metric's name, what it times.
TABLES = (("operations", "fuse_request", "FUSE requests packfs's handlers served"),
          ("device", "device_op", "the log's writes and flushes to the backing disk"))
_TABLE_FIELDS = frozenset(t[0] for t in TABLES)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _figures(stats: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[str, object]]:
    """(name, value) for every figure outside the per-operation tables, nested ones flattened."""
    for key, value in stats.items():
        if not path and key in _TABLE_FIELDS:
            continue
        if isinstance(value, dict):
            yield from _figures(value, (*path, key))
        else:
            yield "_".join((*path, key)), value


def render(stats: dict) -> str:
    """The stats dict of one mount (`packfs stats --json`) as Prometheus text exposition."""
    mountpoint = stats["mountpoint"]
    base = {"device": os.path.basename(mountpoint.rstrip("/")) or "/", "mountpoint": mountpoint}
    out: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
        out.append(f"# HELP {PREFIX}{name} {help_}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        out.extend(f"{PREFIX}{name}{suffix}{_labels({**base, **extra})} {_number(v)}" for suffix, extra, v in samples)

    info = {}
    for name, value in _figures(stats):
        if name == "broken":
            family("broken", "gauge", "1 once an I/O error of the backing disk stopped every change until a remount",
                   [("", {}, int(value is not None))])
        elif isinstance(value, str):
            if name != "mountpoint":  # a label of every sample already
                info[name] = value
        elif value is None:
            continue  # none yet (seconds_since_commit before a commit) or not kept (far_times)
        elif name in COUNTERS:
            family(f"{name}_total", "counter", f"packfs stats `{name}` since the mount (docs/stats.md)",
                   [("", {}, value)])
        else:
            family(name, "gauge", f"packfs stats `{name}` (docs/stats.md)", [("", {}, value)])
    family("info", "gauge", "the daemon's text figures as labels: its version, pack directory, log writer",
           [("", info, 1)])
    for field, name, what in TABLES:
        ops = stats.get(field, {})
        family(f"{name}_seconds", "summary", f"time in packfs of {what}, by op",
               [s for op, o in ops.items() for s in (
                   ("", {"op": op, "quantile": "0.5"}, o["p50_us"] / 1e6),
                   ("", {"op": op, "quantile": "0.99"}, o["p99_us"] / 1e6),
                   ("_sum", {"op": op}, o["total_us"] / 1e6),
                   ("_count", {"op": op}, o["count"]))])
        family(f"{name}_errors_total", "counter", f"{what} that failed, by op",
               [("", {"op": op}, o["errors"]) for op, o in ops.items()])
        family(f"{name}_refused_total", "counter", f"{what} refused by design (EOPNOTSUPP: POSIX ACLs, ...), by op",
               [("", {"op": op}, o["refused"]) for op, o in ops.items()])
    return "\n".join(out) + "\n"
