"""bench/report.py judges the scale part's targets only at the million objects they are set at."""
from bench import report


def _run(objects: int) -> dict:
    """A minimal merged run: the cold walk (a ratio target), the RSS (a bound) and a Swift row."""
    meta = {"scale.walk.cold.s": {"label": "cold walk", "unit": "s", "better": "lower", "order": 1},
            "scale.rss_per_file": {"label": "RSS per file", "unit": "B/file", "better": "lower", "order": 2,
                                   "absolute": True},
            "swift.put.4k.c16.ops": {"label": "PUT", "unit": "ops/s", "better": "higher", "order": 3}}
    medians = {"scale.walk.cold.s": {"packfs": 2.0, "xfs": 20.0},  # 10x faster: would pass
               "scale.rss_per_file": {"packfs": 300.0},  # would miss
               "swift.put.4k.c16.ops": {"packfs": 100.0, "xfs": 400.0}}  # misses whatever the scale
    return {"meta": meta, "medians": medians, "config": {"scale": {"scale": {"objects": objects}}}}


def test_scale_targets_are_not_judged_below_a_million_objects():
    ev = report.evaluate(_run(20_000))
    assert ev["scale.walk.cold.s"] == ("≥ 5x at 1M", "n/a")
    assert ev["scale.rss_per_file"] == ("≤ 200 at 1M", "n/a")
    assert ev["swift.put.4k.c16.ops"] == ("≥ 0.5x", "MISS")


def test_scale_targets_are_judged_at_a_million_objects():
    ev = report.evaluate(_run(1_000_000))
    assert ev["scale.walk.cold.s"] == ("≥ 5x", "PASS")
    assert ev["scale.rss_per_file"] == ("≤ 200", "MISS")
