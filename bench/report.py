"""One table for the run: medians per filesystem, packfs/XFS and packfs/ext4 ratios,
the issue's targets marked PASS/MISS; written as JSON, Markdown and PNG plots.

A ratio is always *relative performance*: for rates (higher is better) it is
packfs / XFS; for times and latencies (lower is better) it is XFS / packfs.  So a ratio
above 1 always means packfs is better.
"""
from __future__ import annotations

import math
from pathlib import Path

from . import diskmodel, haltpoll, seed004, steal
from .util import write_json

FS = ("packfs", "xfs", "ext4")
SWEEP_K = (50, 100, 200, 300, 1000)
DIP_LIMIT = 0.8   # a step to the next larger size may lose at most 20% of bytes/s
SCALE_TARGETS_AT = 1_000_000  # objects the scale part's targets are set at

# (key, kind, threshold, description)
#   ratio : packfs/XFS relative performance >= threshold
#   max   : packfs value <= threshold (absolute)
#   min   : packfs value >= threshold (absolute)
TARGETS = [
    ("swift.put.4k.c16.ops", "ratio", 0.5, "4 KiB PUT c16 >= 0.5x XFS"),
    ("swift.get.4k.c16.ops", "ratio", 0.5, "4 KiB GET c16 >= 0.5x XFS"),
    ("swift.delete.4k.c16.ops", "ratio", 0.5, "4 KiB DELETE c16 >= 0.5x XFS"),
    ("swift.put.100k.c16.ops", "ratio", 0.6, "100 KiB PUT c16 >= 0.6x XFS"),
    ("swift.get.100k.c16.ops", "ratio", 0.6, "100 KiB GET c16 >= 0.6x XFS"),
    ("swift.put.1m.c16.ops", "ratio", 0.6, "1 MiB PUT c16 >= 0.6x XFS"),
    ("swift.get.1m.c16.ops", "ratio", 0.6, "1 MiB GET c16 >= 0.6x XFS"),
    ("swift.bigput.cl.mibs", "ratio", 0.7, "large PUT (content-length) >= 0.7x XFS"),
    ("swift.bigput.chunked_vs_cl", "min", 0.9, "chunked PUT within 10% of content-length"),
    ("fio.small.j4.files", "ratio", 1.0, "fio small files, 4 jobs >= 1.0x XFS"),
    ("fio.stream.64k.mibs", "ratio", 0.5, "fio 64 KiB stream >= 0.5x XFS"),
    ("scale.walk.cold.s", "ratio", 5.0, "cold replicator walk >= 5x XFS"),
    ("scale.get.c16.cold.ops", "ratio", 2.0, "cold random GETs >= 2x XFS"),
    ("scale.rss_per_file", "max", 200, "daemon RSS per file <= 200 B"),
    ("scale.mount.clean.s", "max", 5.0, "clean mount < 5 s"),
    ("scale.mount.recovery.s", "max", 15.0, "recovery after kill -9 < 15 s"),
    ("fio.sweep.nodip", "min", DIP_LIMIT, "fio size sweep: no step loses > 20% bytes/s"),
    ("swift.sweep.put.nodip", "min", DIP_LIMIT, "Swift PUT size sweep: no dip > 20%"),
    ("swift.sweep.get.nodip", "min", DIP_LIMIT, "Swift GET size sweep: no dip > 20%"),
]
# On the hdd model (bench/diskmodel.py), the issue's targets for seed 004's tables, in the
# 500 B/object memory budget where a case runs in one.
HDD_TARGETS = [
    ("scale.get.c1.cold.cg500.ops", "ratio", 3.0, "cold GET c1 >= 3x XFS"),
    ("scale.get.c16.cold.cg500.ops", "ratio", 3.0, "cold GET c16 >= 3x XFS"),
    ("scale.get.c1.cold.cg500.reads_per_GET", "max", 1.1, "disk reads per cold GET <= 1.1"),
    ("scale.get.c16.cold.cg500.reads_per_GET", "max", 1.1, "disk reads per cold GET <= 1.1"),
    ("scale.put.c1.full.ops", "ratio", 2.0, "single-threaded PUT >= 2x XFS"),
    ("scale.put.c1.half.ops", "ratio", 2.0, "single-threaded PUT >= 2x XFS"),
    ("scale.put.c16.cold.cg500.writes_per_PUT", "max", 1.0, "disk writes per PUT at c16 <= 1"),
    ("scale.put.paced.cold.p99", "ratio", 5.0, "PUT 20/s after dropping caches: p99 <= 1/5 of XFS's"),
    ("scale.get.beside_walk.cg500.ops", "ratio", 5.0, "GETs during walk + auditor >= 5x XFS"),
    ("scale.walk.cold.cg500.reads_per_dir", "max", 0.0, "cold walk: 0 disk reads per directory"),
    ("scale.rss_per_file", "max", 200, "daemon RSS per file <= 200 B"),
    ("scale.mount.clean.s", "max", 5.0, "clean mount < 5 s"),
    ("scale.mount.recovery.s", "max", 15.0, "recovery after kill -9 < 15 s"),
]


def disk_model(d: dict) -> str:
    """The disk model a merged run was measured on ('fast' for runs made before there was a choice)."""
    for c in d.get("config", {}).values():
        if c and c.get("disk"):
            return c["disk"]["kind"]
    return "fast"


def merge(parts: list[dict]) -> dict:
    out = {"meta": {}, "medians": {}, "samples": {}, "details": {}, "tables": {}, "notes": [],
           "config": {}, "steal": {}, "parts": [p["part"] for p in parts], "started": None, "host": None}
    for p in parts:
        out["meta"].update(p["meta"])
        out["medians"].update(p["medians"])
        out["samples"].update(p["samples"])
        out["details"].update(p.get("details", {}))
        out["tables"].update(p.get("tables", {}))
        out["notes"] += p.get("notes", [])
        out["config"][p["part"]] = p.get("config", {})
        if p.get("steal"):
            out["steal"][p["part"]] = p["steal"]
        out["started"] = out["started"] or p.get("started")
        out["host"] = out["host"] or p.get("host")
    # rows in part order (fio, swift, scale as run), then in the order they were defined
    for m in out["meta"].values():
        pi = out["parts"].index(m["part"]) if m.get("part") in out["parts"] else len(out["parts"])
        m["order"] = pi * 100000 + m.get("order", 0) % 100000
    _derive(out)
    seed_table = seed004.table(out["medians"], disk_model(out),
                               out["config"].get("scale", {}).get("scale", {}).get("objects"))
    if seed_table:
        out["tables"]["seed004"] = seed_table
    steal_table = steal.table(out["steal"])
    if steal_table:
        out["tables"]["steal"] = steal_table
    return out


def _derive(d: dict) -> None:
    """Derived rows: sweep dips and chunked/content-length."""
    med, meta = d["medians"], d["meta"]

    def dip(prefix: str, suffix: str, label: str, group: str):
        keys = [f"{prefix}.{k}k.{suffix}" for k in SWEEP_K]
        if not all(k in med for k in keys):
            return
        row = {}
        for fs in FS:
            vals = [med[k].get(fs) for k in keys]
            if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals):
                continue
            # bytes/s at each size; worst ratio of a step to the previous (smaller) size
            bps = [v * (k << 10) if suffix == "ops" else v for v, k in zip(vals, SWEEP_K)]
            row[fs] = min(b / a for a, b in zip(bps, bps[1:]) if a > 0) if len(bps) > 1 else 1.0
        key = f"{prefix}.nodip"
        med[key] = row
        meta[key] = {"label": label, "unit": "worst step", "better": "higher", "group": group,
                     "order": max(m["order"] for k, m in meta.items()  # after the sweep's rows, not after
                                  if k.startswith(".".join(prefix.split(".")[:2]) + ".")  # the other dip
                                  and not k.endswith(".nodip")) + 0.5,
                     "absolute": True}

    dip("fio.sweep", "mibs", "fio size sweep: worst bytes/s step ratio (next size / previous)", "fio-sweep")
    for op in ("put", "get"):
        suffix = "mibs" if f"swift.sweep.{op}.50k.mibs" in med else "ops"
        dip(f"swift.sweep.{op}", suffix, f"Swift {op.upper()} c1 size sweep: worst bytes/s step ratio",
            "swift-sweep")

    cl, ch = med.get("swift.bigput.cl.mibs"), med.get("swift.bigput.chunked.mibs")
    if cl and ch:
        med["swift.bigput.chunked_vs_cl"] = {fs: ch[fs] / cl[fs] for fs in FS if fs in cl and fs in ch and cl[fs]}
        meta["swift.bigput.chunked_vs_cl"] = {
            "label": "large PUT: chunked (64 KiB pieces) / content-length throughput", "unit": "ratio",
            "better": "higher", "group": "swift-big", "order": meta["swift.bigput.chunked.mibs"]["order"] + 0.5,
            "absolute": True}


def rel(meta: dict, a: float | None, b: float | None) -> float | None:
    """Relative performance of a over b (> 1: a is better)."""
    if a is None or b is None or _nan(a) or _nan(b) or meta.get("absolute"):
        return None
    if meta["better"] == "lower":
        return b / a if a > 0 else None
    return a / b if b > 0 else None


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _fmt(v, unit: str = "") -> str:
    if v is None or _nan(v):
        return "—"
    if isinstance(v, str):
        return v
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def evaluate(d: dict) -> dict[str, tuple[str, str]]:
    """key -> (target text, PASS/MISS/n/a). The scale part's targets are set at a million
    objects (issue 5): a run with fewer (QUICK's 20k) shows them n/a, not judged."""
    med, meta = d["medians"], d["meta"]
    objects = d.get("config", {}).get("scale", {}).get("scale", {}).get("objects")
    out = {}
    for key, kind, thr, text in (HDD_TARGETS if disk_model(d) == "hdd" else TARGETS):
        if key not in med:
            continue
        tt = f"≥ {thr:g}x" if kind == "ratio" else f"≤ {thr:g}" if kind == "max" else f"≥ {thr:g}"
        if key.startswith("scale.") and objects is not None and objects < SCALE_TARGETS_AT:
            out[key] = (tt + " at 1M", "n/a")
            continue
        pv = med[key].get("packfs")
        if kind == "ratio":
            r = rel(meta[key], pv, med[key].get("xfs"))
            ok = None if r is None else r >= thr
        elif kind == "max":
            ok = None if pv is None or _nan(pv) else pv <= thr
        else:
            ok = None if pv is None or _nan(pv) else pv >= thr
        out[key] = (tt, "n/a" if ok is None else ("PASS" if ok else "MISS"))
    return out


def rows(d: dict, detail: bool = False) -> list[list[str]]:
    med, meta = d["medians"], d["meta"]
    ev = evaluate(d)
    table = []
    for key in sorted(med, key=lambda k: (meta[k].get("order", 0))):
        m = meta[key]
        if bool(m.get("minor")) != detail:
            continue
        v = {fs: med[key].get(fs) for fs in FS}
        tt, st = ev.get(key, ("", ""))
        table.append([m["label"], m["unit"], _fmt(v["packfs"]), _fmt(v["xfs"]), _fmt(v["ext4"]),
                      _fmt(rel(m, v["packfs"], v["xfs"])), _fmt(rel(m, v["packfs"], v["ext4"])), tt, st, key])
    return table


HEAD = ["case", "unit", "packfs", "XFS", "ext4", "packfs/XFS", "packfs/ext4", "target", "result"]


def text_table(d: dict) -> str:
    rs = [r[:9] for r in rows(d)]
    w = [max(len(str(x)) for x in col) for col in zip(HEAD, *rs)] if rs else [len(h) for h in HEAD]
    lines = ["  ".join(h.ljust(w[i]) if i < 2 else h.rjust(w[i]) for i, h in enumerate(HEAD))]
    lines.append("  ".join("-" * x for x in w))
    for r in rs:
        lines.append("  ".join(str(c).ljust(w[i]) if i < 2 else str(c).rjust(w[i]) for i, c in enumerate(r)))
    return "\n".join(lines)


def markdown(d: dict, title: str = "packfs benchmark") -> str:
    out = [f"# {title}", ""]
    host = d.get("host") or {}
    out.append(f"Run started {d.get('started')} on {host.get('node')} (kernel {host.get('kernel')}, "
               f"Python {host.get('python')}); parts: {', '.join(d['parts'])}.")
    cfg = d.get("config", {})
    common = next((c for c in cfg.values() if c), {})
    if common:
        out.append(f"Mode: {'QUICK' if common.get('quick') else 'full'}, {common.get('reps')} repetitions "
                   "(filesystems interleaved, order rotated each repetition), medians shown.")
        if "guest_halt_poll_ns" in common:
            out.append(haltpoll.describe(common["guest_halt_poll_ns"], common.get("halt_poll_asked", False)))
        if common.get("disk"):
            out.append(f"Disk model: {diskmodel.DiskModel(**common['disk']).describe()}.")
    if d.get("steal"):
        out.append(steal.summary(d["steal"], FS))
    out += ["", "Ratios are relative performance (rates: packfs/XFS; times and latencies: XFS/packfs), "
            "so above 1 means packfs is better. Targets are from the benchmark issue (fast model) or the hard-disk "
            "issue (hdd model); PASS/MISS compare packfs with XFS "
            "(or an absolute bound).", ""]
    out.append("| " + " | ".join(HEAD) + " |")
    out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEAD))) + "|")
    for r in rows(d):
        st = r[8]
        r8 = f"**{st}**" if st == "MISS" else st
        out.append("| " + " | ".join([*r[:8], r8]) + " |")
    det = rows(d, detail=True)
    if det:
        out += ["", "## Detail rows (latency mean, p95, max; sweep ops/s and files/s)", ""]
        out.append("| " + " | ".join(HEAD[:7]) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(7)) + "|")
        for r in det:
            out.append("| " + " | ".join(r[:7]) + " |")
    for name, t in d.get("tables", {}).items():
        out += ["", f"## {t.get('title', name)}", ""]
        if t.get("note"):
            out += [t["note"], ""]
        cols = t["columns"]
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|")
        for row in t["rows"]:
            out.append("| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |")
    if d.get("notes"):
        out += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(out) + "\n"


def plots(d: dict, outdir: Path) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return []
    made = []
    med, meta = d["medians"], d["meta"]
    # 1. relative performance vs XFS for every row that has one
    keys = [k for k in sorted(med, key=lambda k: meta[k].get("order", 0))
            if not meta[k].get("absolute") and not meta[k].get("minor") and med[k].get("xfs") and "p99" not in k and "p50" not in k
            and "p95" not in k and ".max" not in k and ".mean" not in k]
    if keys:
        fig, ax = plt.subplots(figsize=(10, max(3, 0.28 * len(keys) + 1)))
        y = range(len(keys))
        for off, fs, col in ((-0.2, "packfs", "tab:blue"), (0.2, "ext4", "tab:green")):
            vals = [rel(meta[k], med[k].get(fs), med[k].get("xfs")) or 0 for k in keys]
            ax.barh([i + off for i in y], vals, height=0.4, label=f"{fs} / XFS", color=col)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(list(y))
        ax.set_yticklabels([meta[k]["label"][:70] for k in keys], fontsize=6)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("relative performance vs XFS (log; >1 is better)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = outdir / "ratios.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    # 2. size sweeps: bytes/s against size
    series = [("fio.sweep.{}k.mibs", "fio write+fsync", 1.0)]
    for op in ("put", "get"):
        unit = "mibs" if f"swift.sweep.{op}.50k.mibs" in med else "ops"
        series.append((f"swift.sweep.{op}.{{}}k.{unit}", f"Swift {op.upper()} c1", None))
    present = [s for s in series if all(s[0].format(k) in med for k in SWEEP_K)]
    if present:
        fig, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.6), squeeze=False)
        for ax, (pat, title, _) in zip(axes[0], present):
            for fs, col in (("packfs", "tab:blue"), ("xfs", "tab:orange"), ("ext4", "tab:green")):
                vals = []
                for k in SWEEP_K:
                    v = med[pat.format(k)].get(fs)
                    if v is not None and pat.endswith(".ops"):
                        v = v * (k << 10) / 2**20
                    vals.append(v)
                if any(v is not None for v in vals):
                    ax.plot(SWEEP_K, vals, marker="o", label=fs, color=col)
            ax.set_xscale("log")
            ax.set_xticks(SWEEP_K)
            ax.set_xticklabels([str(k) for k in SWEEP_K])
            ax.set_xlabel("object / file size (KiB)")
            ax.set_ylabel("MiB/s")
            ax.set_title(title)
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = outdir / "sweeps.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made


def report(outdir: Path, part_dicts: list[dict], name: str = "bench") -> str:
    d = merge(part_dicts)
    write_json(outdir / f"{name}.json", d)
    md = markdown(d)
    (outdir / f"{name}.md").write_text(md)
    made = plots(d, outdir)
    seed_plot = seed004.plot(d["medians"], disk_model(d), outdir)
    if seed_plot:
        made.append(seed_plot)
    if made:
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made) + "\n"
        (outdir / f"{name}.md").write_text(md)
    return text_table(d)
