"""profiling.loadgen and the library parts it runs on (profiling.lib): the pure parts, no cluster."""
from __future__ import annotations

import json
import math

import pytest

from profiling import loadgen
from profiling.lib import cli, load, prometheus, report

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------- pure parts (no cluster)

def test_schedule_parsing():
    course = load.parse_schedule("course")
    assert [(g.count, g.interval_s) for g in course] == [(10, 10.0), (20, 5.0), (50, 1.0)]
    scaled = load.parse_schedule("3x2,4x0.5", time_scale=0.1)
    assert [(g.name, g.count) for g in scaled] == [("3x2", 3), ("4x0.5", 4)]
    assert [g.interval_s for g in scaled] == pytest.approx([0.2, 0.05])
    for bad in ("3", "x2", "0x1", "3x", "3x2,", "ax1"):
        with pytest.raises(ValueError):
            load.parse_schedule(bad)


def test_modes_plan_bounded_groups():
    def plan(*argv):
        return loadgen.plan_groups(loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", *argv]))

    mode, (group,) = plan("--rate", "0.5", "--count", "4")
    assert mode == "rate" and (group.count, group.interval_s) == (4, 2.0)
    mode, (group,) = plan("--concurrency", "3", "--count", "9", "--duration", "60")
    assert mode == "closed" and (group.concurrency, group.count, group.duration_s) == (3, 9, 60)
    mode, groups = plan("--sweep", "4,1,2", "--count-per-level", "5")
    assert mode == "sweep" and [(g.concurrency, g.count) for g in groups] == [(1, 5), (2, 5), (4, 5)]
    mode, groups = plan("--schedule", "course", "--time-scale", "0.01")
    assert mode == "schedule" and [g.interval_s for g in groups] == pytest.approx([0.1, 0.05, 0.01])
    with pytest.raises(SystemExit):  # every loop is bounded in count
        loadgen.main(["--url", "http://127.0.0.1:1", "--concurrency", "2"])


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.8.9.10:1/", "http://localhost:80",
                                 "http://[::1]:8000"])
def test_loopback_targets_pass(url):
    assert cli.check_target(url, allow_remote=False) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://example.com/metrics", "http://0.0.0.0:8000",
                                 "ftp://127.0.0.1/", "127.0.0.1:8000"])
def test_other_targets_are_refused(url):
    with pytest.raises(cli.TargetRefused):
        cli.check_target(url, allow_remote=False)


def test_remote_needs_allow_remote():
    assert cli.check_target("http://10.0.0.5:8000", allow_remote=True) == "http://10.0.0.5:8000"
    # Refused before anything is sent: no health check, no load.
    assert loadgen.main(["--url", "http://10.0.0.5:8000", "--concurrency", "1", "--count", "1",
                         "--metrics-urls", "none"]) == 2


METRICS_BEFORE = """
# TYPE rag_batch_size histogram
rag_batch_size_bucket{stage="generate",le="+Inf"} 2
rag_batch_size_count{stage="generate"} 2
rag_batch_size_sum{stage="generate"} 3
# TYPE rag_batch_run_seconds counter
rag_batch_run_seconds_total{stage="generate"} 10
# TYPE rag_batch_wait_seconds counter
rag_batch_wait_seconds_total{stage="generate"} 1
# TYPE rag_http_requests counter
rag_http_requests_total{endpoint="/query",status="200"} 3
"""
METRICS_AFTER = """
# TYPE rag_batch_size histogram
rag_batch_size_bucket{stage="generate",le="+Inf"} 5
rag_batch_size_count{stage="generate"} 5
rag_batch_size_sum{stage="generate"} 15
# TYPE rag_batch_run_seconds counter
rag_batch_run_seconds_total{stage="generate"} 40
# TYPE rag_batch_wait_seconds counter
rag_batch_wait_seconds_total{stage="generate"} 7
# TYPE rag_batch_queue_depth gauge
rag_batch_queue_depth{stage="generate"} 0
# TYPE rag_process_peak_rss_bytes gauge
rag_process_peak_rss_bytes 1048576
# TYPE rag_http_requests counter
rag_http_requests_total{endpoint="/query",status="200"} 15
"""


def test_metrics_deltas():
    before = prometheus.MetricsSnapshot("u", prometheus.parse_metrics(METRICS_BEFORE))
    after = prometheus.MetricsSnapshot("u", prometheus.parse_metrics(METRICS_AFTER))
    node = prometheus.node_delta(before, after)
    (stage,) = node.stages
    assert (stage.stage, stage.batches, stage.items) == ("generate", 3, 12)
    assert stage.mean_batch_size == 4 and stage.mean_batch_run_s == 10 and stage.mean_item_wait_s == 0.5
    assert node.peak_rss_bytes == 1048576 and node.rss_bytes is None  # absent metrics are tolerated
    assert node.http_requests == {"/query 200": 12}
    missing = prometheus.node_delta(before, prometheus.MetricsSnapshot("u", {}, "http_404"))
    assert missing.error == "http_404" and missing.stages == []


def _stats(rpm: float, p95: float) -> report.RunStats:
    latency = report.LatencyStats(4, p95, p95, p95, p95, p95)
    return report.RunStats("x", 4, 4, 4, {}, 60.0, rpm, latency, 0.0, {})


def test_saturation_knee():
    levels = [1, 2, 4, 8]
    # Throughput scales to c=4, then flattens while p95 nearly doubles: the knee is at 8.
    knee = report.find_saturation(levels, [_stats(10, 6), _stats(19, 6.3), _stats(30, 8), _stats(31, 15)])
    assert (knee.reached, knee.level, knee.knee_level, knee.throughput_rpm) == (True, 4, 8, 30)
    assert (knee.max_throughput_rpm, knee.max_throughput_level) == (31, 8)
    assert "p95_b/p95_a" in knee.rule
    scaling = report.find_saturation(levels, [_stats(10, 6), _stats(20, 6), _stats(40, 6.5), _stats(70, 7)])
    assert (scaling.reached, scaling.level, scaling.throughput_rpm) == (False, 8, 70)
    failing = report.find_saturation([1, 2], [_stats(10, 6), _stats(0, math.nan)])
    assert (failing.reached, failing.level) == (True, 1)


def test_sweep_plot_and_summary_json(tmp_path):
    results = []
    for level, rpm, p95 in ((1, 10, 6), (2, 19, 6.3), (4, 20, 13)):
        record = load.RequestRecord(f"r{level}", f"c{level}", 0, level, level + 0.01, p95, 200)
        results.append(loadgen.GroupResult(load.ClosedGroup(f"c{level}", 1, level), [record],
                                           _stats(rpm, p95), []))
    saturation = report.find_saturation([1, 2, 4], [r.stats for r in results])
    paths = loadgen.write_plots(tmp_path, "t", results, saturation)
    assert [p.name for p in paths] == ["loadgen_t_latency.png", "loadgen_t_sweep.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    path = loadgen.write_summary(tmp_path / "s.json", {"saturation": saturation, "nan": math.nan})
    assert json.loads(path.read_text())["saturation"]["level"] == 2
