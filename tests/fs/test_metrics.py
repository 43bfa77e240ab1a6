"""`packfs stats --prometheus` of a real mount, read by prometheus_client's parser, against
`stats --json`; and mount/packfs-metrics, which packfs-metrics.timer runs every minute,
writing it into a textfile directory (and removing it once the daemon is dead)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fsutil import write_file
from mounts import PACKFS, force_unmount, kill_daemon, mounted, stats

from packfs.prometheus import COUNTERS

ROOT = Path(__file__).resolve().parents[2]
# Figures that move on their own between two requests of stats.
MOVING = {"rss_bytes", "rss_per_file", "uptime_seconds", "seconds_since_commit", "last_checkpoint_seconds"}


def _leaves(d: dict, path: tuple[str, ...] = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*path, k))
        else:
            yield "_".join((*path, k)), v


def _samples(text: str) -> dict[tuple[str, frozenset], tuple[str, float]]:
    """(sample name, labels other than device and mount point) -> (its family's type, value)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("device", "mountpoint")}
            out[s.name, frozenset(labels.items())] = (fam.type, s.value)
    return out


def test_prometheus_output_holds_every_figure_of_stats_json(mnt):
    write_file(mnt / "f", b"x" * 5000, fsync=True)  # so that operations and device have rows
    os.listxattr(mnt / "f")
    before = stats(mnt)
    text = subprocess.run([*PACKFS, "stats", str(mnt), "--prometheus"], check=True, capture_output=True,
                          text=True).stdout
    after = stats(mnt)
    got = _samples(text)
    for fam in text_string_to_metric_families(text):
        assert all(s.labels["device"] == "mnt" and s.labels["mountpoint"] == str(mnt) for s in fam.samples)
    numbers = 0
    for name, v in _leaves({k: v for k, v in before.items() if k not in ("operations", "device")}):
        if name == "broken":
            assert got["packfs_broken", frozenset()] == ("gauge", 0)
        elif name == "mountpoint":
            assert v == str(mnt)  # every sample's label, checked above
        elif isinstance(v, str):
            info = dict(next(labels for (n, labels) in got if n == "packfs_info"))
            assert info[name] == v
        elif v is not None:
            numbers += 1
            key = (f"packfs_{name}_total" if name in COUNTERS else f"packfs_{name}", frozenset())
            kind, value = got[key]
            assert kind == ("counter" if name in COUNTERS else "gauge"), name
            if name not in MOVING:
                low, high = sorted((v, dict(_leaves(after))[name]))
                assert low <= value <= high, (name, v, value)
    assert numbers > 40
    for table, metric in (("operations", "packfs_fuse_request"), ("device", "packfs_device_op")):
        assert before[table]
        for op, o in before[table].items():
            assert got[f"{metric}_seconds_count", frozenset({("op", op)})] == ("summary", o["count"])
            assert got[f"{metric}_seconds_sum", frozenset({("op", op)})][1] * 1e6 == \
                pytest.approx(o["total_us"])
            q99 = got[f"{metric}_seconds", frozenset({("op", op), ("quantile", "0.99")})]
            assert q99[0] == "summary" and q99[1] * 1e6 == pytest.approx(o["p99_us"])
            assert got[f"{metric}_errors_total", frozenset({("op", op)})] == ("counter", o["errors"])
            assert got[f"{metric}_refused_total", frozenset({("op", op)})] == ("counter", o["refused"])


def test_the_timer_script_writes_the_textfile_atomically_and_drops_a_dead_mount(tmp_path, packdir):
    textfiles = tmp_path / "textfile_collector"
    textfiles.mkdir()
    wrapper = tmp_path / "packfs"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m packfs.cli \"$@\"\n")
    wrapper.chmod(0o755)
    env = {**os.environ, "PACKFS": str(wrapper), "PACKFS_TEXTFILE_DIR": str(textfiles),
           "PYTHONPATH": str(ROOT)}
    mnt = tmp_path / "sdb9"
    with mounted(packdir, mnt):
        try:
            run = subprocess.run([ROOT / "mount" / "packfs-metrics", str(mnt)], env=env, capture_output=True,
                                 text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            assert os.listdir(textfiles) == ["packfs-sdb9.prom"]  # no temporary file left
            fams = {f.name: f for f in text_string_to_metric_families((textfiles / "packfs-sdb9.prom").read_text())}
            assert fams["packfs_files"].samples[0].labels["device"] == "sdb9"
            assert fams["packfs_pid"].samples[0].value == stats(mnt)["pid"]
            kill_daemon(packdir)
            run = subprocess.run([ROOT / "mount" / "packfs-metrics", str(mnt)], env=env, capture_output=True,
                                 text=True, timeout=120)
            assert run.returncode == 1 and "has died" in run.stderr
            assert os.listdir(textfiles) == []
        finally:
            force_unmount(mnt, packdir)
