"""packfs.prometheus: the stats dict as Prometheus text, read back by prometheus_client's
own parser: names, types, labels and values, and every figure taken."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from packfs.prometheus import render

OP = {"count": 4, "errors": 1, "refused": 2, "total_us": 100.0, "mean_us": 25.0, "p50_us": 11.3, "p99_us": 77.9}
STATS = {
    "pid": 4242, "version": "0.1.0", "pack_directory": "/srv/packs/sdb1", "mountpoint": '/srv/node "x"\\y/sdb1',
    "files": 10, "bytes": 12345, "rss_per_file": 192.5, "commits": 7, "seconds_since_commit": None,
    "zero_message_open": True, "fallocate": False, "broken": None, "log_writer": "c",
    "recovery": {"replayed": 3, "orphans": 0, "seconds": 0.25},
    "far_times": {"atime": 5, "ctime": None},
    "passthrough": {"active": False},
    "operations": {"setxattr": OP, "write": {**OP, "count": 9}},
    "device": {"disk_flush": {**OP, "errors": 0}},
}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    found = [s.value for s in fams[family].samples
             if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family, sample, labels, fams[family].samples)
    return found[0]


def test_figures_keep_their_values_and_types():
    fams = families(render(STATS))
    assert (fams["packfs_files"].type, value(fams, "packfs_files")) == ("gauge", 10)
    assert (fams["packfs_commits"].type, value(fams, "packfs_commits", "packfs_commits_total")) == ("counter", 7)
    assert value(fams, "packfs_rss_per_file") == 192.5
    assert value(fams, "packfs_recovery_replayed") == 3 and value(fams, "packfs_recovery_seconds") == 0.25
    assert value(fams, "packfs_far_times_atime") == 5
    assert (value(fams, "packfs_zero_message_open"), value(fams, "packfs_fallocate")) == (1, 0)
    assert value(fams, "packfs_passthrough_active") == 0 and value(fams, "packfs_pid") == 4242
    assert value(fams, "packfs_broken") == 0
    assert "packfs_seconds_since_commit" not in fams and "packfs_far_times_ctime" not in fams  # null: none yet
    info = fams["packfs_info"].samples[0]
    assert info.value == 1 and info.labels["version"] == "0.1.0" and info.labels["log_writer"] == "c"
    assert info.labels["pack_directory"] == "/srv/packs/sdb1"


def test_operations_are_summaries_and_counters_by_op():
    fams = families(render(STATS))
    lat = fams["packfs_fuse_request_seconds"]
    assert lat.type == "summary"
    assert value(fams, "packfs_fuse_request_seconds", op="write", quantile="0.99") == pytest.approx(77.9e-6)
    assert value(fams, "packfs_fuse_request_seconds", op="setxattr", quantile="0.5") == pytest.approx(11.3e-6)
    assert value(fams, "packfs_fuse_request_seconds", "packfs_fuse_request_seconds_count", op="write") == 9
    assert value(fams, "packfs_fuse_request_seconds", "packfs_fuse_request_seconds_sum", op="write") == pytest.approx(100e-6)
    assert fams["packfs_fuse_request_errors"].type == fams["packfs_fuse_request_refused"].type == "counter"
    assert value(fams, "packfs_fuse_request_refused", "packfs_fuse_request_refused_total", op="setxattr") == 2
    assert value(fams, "packfs_device_op_errors", "packfs_device_op_errors_total", op="disk_flush") == 0


def test_every_sample_names_the_device_and_mount_point_escaped():
    text = render(STATS)
    fams = families(text)
    for fam in fams.values():
        assert fam.documentation, fam.name
        for s in fam.samples:
            assert s.labels["device"] == "sdb1" and s.labels["mountpoint"] == STATS["mountpoint"], s


def test_a_broken_mount_says_so():
    fams = families(render({**STATS, "broken": "Input/output error"}))
    assert value(fams, "packfs_broken") == 1
