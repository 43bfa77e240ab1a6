"""Seed 004's own figures beside this run's: the table and its plot.

The seed measured stock Swift 2.12 on XFS and the LOSF prototype on one HGST
HUS726040ALA610 (4 TB, 7200 rpm), objects under 100 B, single-threaded PUTs from 0 to 4 M
and 4 M to 8 M objects, single-threaded GETs at 8 M, and PUTs at 20/s for 10 minutes.
This run's figures are at its own object count (N/2 and N) and on its own disk model,
which the table's heading names: read them side by side, not as the same experiment.
"""
from __future__ import annotations

from pathlib import Path

# row -> (this run's key, unit, the seed's XFS, the seed's LOSF)
SEED_ROWS = [
    ("single-threaded PUT, 0 to N/2 (seed: 0 to 4 M)", "scale.put.c1.half.ops", "PUT/s", 19.8, 26.2),
    ("single-threaded PUT, N/2 to N (seed: 4 M to 8 M)", "scale.put.c1.full.ops", "PUT/s", 17.0, 39.2),
    ("single-threaded cold GET at N (seed: 8 M)", "scale.get.c1.cold.ops", "GET/s", 39.0, 93.0),
    ("PUT 20/s, hot cache: mean", "scale.put.paced.hot.mean", "ms", 641.3, 82.6),
    ("PUT 20/s, hot cache: p50", "scale.put.paced.hot.p50", "ms", 67.3, 50.5),
    ("PUT 20/s, hot cache: p95", "scale.put.paced.hot.p95", "ms", 3526.8, 261.5),
    ("PUT 20/s, hot cache: p99", "scale.put.paced.hot.p99", "ms", 4689.2, 615.6),
    ("PUT 20/s, hot cache: max", "scale.put.paced.hot.max", "ms", 5971.9, 1245.5),
    ("PUT 20/s, after dropping caches: mean", "scale.put.paced.cold.mean", "ms", 29211.4, 9290.4),
    ("PUT 20/s, after dropping caches: p50", "scale.put.paced.cold.p50", "ms", 30002.8, 8216.1),
    ("PUT 20/s, after dropping caches: p95", "scale.put.paced.cold.p95", "ms", 30003.0, 24212.6),
    ("PUT 20/s, after dropping caches: p99", "scale.put.paced.cold.p99", "ms", 31001.1, 29460.9),
    ("PUT 20/s, after dropping caches: max", "scale.put.paced.cold.max", "ms", 33005.2, 30001.4),
    ("PUT 20/s, after dropping caches: answered within 30 s", "scale.put.paced.cold.under30", "%", 6.11, 99.26),
]


def table(medians: dict, model: str, objects: int | None) -> dict | None:
    """The side-by-side table for the report (report.markdown renders `tables`)."""
    rows = []
    for label, key, unit, xfs, losf in SEED_ROWS:
        if key not in medians:
            continue
        got = medians[key]
        rows.append([label, unit, xfs, losf, got.get("xfs"), got.get("packfs"), got.get("ext4")])
    if not rows:
        return None
    return {"title": "Seed 004's tables beside this run's",
            "note": (f"The seed: Swift 2.12 on XFS and the LOSF prototype, one 7200 rpm HGST 4 TB drive, 8 M "
                     f"objects. This run: stock Swift {_swift_version()} on the `{model}` disk model, "
                     f"{objects or 0:,} objects (N)."),
            "columns": ["case", "unit", "seed XFS", "seed LOSF", "XFS", "packfs", "ext4"], "rows": rows}


def _swift_version() -> str:
    try:
        from importlib.metadata import version
        return version("swift")
    except Exception:  # noqa: BLE001
        return "(unknown version)"


def plot(medians: dict, model: str, outdir: Path) -> Path | None:
    """Bars of the rate rows and the p99 rows, seed and run, on a log scale."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return None
    groups = [[r for r in SEED_ROWS if r[2].endswith("/s") and r[1] in medians],
              [r for r in SEED_ROWS if r[1].endswith(".p99") and r[1] in medians]]
    groups = [g for g in groups if g]
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    series = (("seed XFS", "tab:gray"), ("seed LOSF", "tab:olive"), ("XFS", "tab:orange"),
              ("packfs", "tab:blue"), ("ext4", "tab:green"))
    for ax, rows in zip(axes[0], groups):
        width = 0.16
        for k, (name, colour) in enumerate(series):
            vals = []
            for label, key, unit, xfs, losf in rows:
                vals.append({"seed XFS": xfs, "seed LOSF": losf}.get(name, medians[key].get(name.lower())) or 0)
            ax.bar([i + (k - 2) * width for i in range(len(rows))], vals, width, label=name, color=colour)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r[0].split(" (seed")[0].replace(", ", ",\n", 1) for r in rows], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("operations/s" if rows[0][2].endswith("/s") else rows[0][2])
        ax.legend(fontsize=7)
    fig.suptitle(f"seed 004 beside this run ({model} disk model)", fontsize=9)
    fig.tight_layout()
    path = outdir / "seed004.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
