"""Small helpers shared by every benchmark part: progress, commands, statistics."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_T0 = time.monotonic()


def log(msg: str) -> None:
    """Progress line on stderr, prefixed with the elapsed wall time of the run."""
    el = time.monotonic() - _T0
    print(f"[bench {int(el) // 60:3d}:{int(el) % 60:02d}] {msg}", file=sys.stderr, flush=True)


def run(args, check: bool = True, timeout: float | None = 3600, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run([str(a) for a in args], timeout=timeout, **kw)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(map(str, args))} -> rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def drop_caches() -> None:
    """Write back dirty data, then drop the page cache, dentries and inodes."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def percentile(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def latency_summary(lat_s: list[float]) -> dict:
    """Latency figures in milliseconds."""
    v = sorted(lat_s)
    if not v:
        return {}
    return {
        "mean": statistics.fmean(v) * 1e3,
        "p50": percentile(v, 50) * 1e3,
        "p95": percentile(v, 95) * 1e3,
        "p99": percentile(v, 99) * 1e3,
        "max": v[-1] * 1e3,
    }


def median(vals: list[float]) -> float:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pids_in_group(pgid: int) -> list[int]:
    """Every live process whose process group is pgid (a server and its workers)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(path)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)


def size_label(n: int) -> str:
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30}G"
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n >> 10}K"
