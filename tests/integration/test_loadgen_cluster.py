"""profiling.loadgen's loops against a real local cluster (the shared one: each run's requests are
its own, and the figures checked are the deltas of its own run)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest

from pipeline import spec
from pipeline.config import REPO_ROOT
from profiling import loadgen
from profiling.lib.load import JOIN_GRACE_S
from tests.fake_node import FakeNode
from tests.helpers import uid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


# ---------------------------------------------------------------- against a local cluster

@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def run_loadgen(cluster, out, *mode: str) -> int:
    # Only node 0's URL: the tool finds nodes 1 and 2 from node 0's /health (its peers).
    return loadgen.main(["--url", cluster.url(0), *mode,
                         "--out", str(out), "--timeout", "120", "--max-duration", "180", "--wait-health", "30"])


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_percentiles(latency: dict) -> None:
    assert 0 < latency["p50_s"] <= latency["p95_s"] <= latency["p99_s"] <= latency["max_s"]


@pytest.fixture(scope="module")
def closed_run(shared_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("loadgen-closed")
    # Questions no other test asked: each one's embedding is computed (not a workers' cache hit).
    queries = out / "queries.txt"
    queries.write_text("".join(f"{question} ({uid('q')})\n" for question in spec.REFERENCE_QUERIES[:6]))
    rc = run_loadgen(shared_cluster, out, "--concurrency", "2", "--count", "6", "--name", "closed",
                     "--queries-file", str(queries))
    return rc, out, json.loads((out / "loadgen_closed.json").read_text())


def test_closed_loop(closed_run):
    rc, out, summary = closed_run
    assert rc == 0
    rows = read_csv(out / "loadgen_closed.csv")
    assert len(rows) == 6 and len({r["request_id"] for r in rows}) == 6
    assert all(r["status"] == "200" and r["error"] == "" for r in rows)
    assert {r["served_by"] for r in rows} <= {"0", "1"}
    overall = summary["overall"]
    assert (overall["planned"], overall["sent"], overall["ok"], overall["errors"]) == (6, 6, 6, {})
    assert overall["throughput_rpm"] > 0
    check_percentiles(overall["latency"])
    assert (out / "loadgen_closed_latency.png").read_bytes().startswith(b"\x89PNG")


def test_every_node_is_found_and_scraped_from_url_alone(cluster, closed_run):
    _, _, summary = closed_run
    # The cluster is on OS-picked ports, not the NODE_<n>_IP defaults 8000-8002 this process would read.
    assert not {cluster.url(n).rsplit(":", 1)[1] for n in range(3)} & {"8000", "8001", "8002"}
    assert summary["metrics_urls"] == [f"{cluster.url(n)}/metrics" for n in range(3)]
    assert [n["error"] for n in summary["nodes"]] == ["", "", ""]
    assert [p["url"] for p in summary["health"]["peers"]] == [cluster.url(1), cluster.url(2)]
    index = {s["stage"]: s["items"] for s in summary["nodes"][2]["stages"]}
    assert index.get("index") == 6  # node 2 really was scraped: its searches moved
    # What the figures were measured with: every node's rag_node_info and settings (or 'unknown' before
    # GET /settings exists), and the tool's commit.
    provenance = summary["provenance"]
    assert [n["info"].get("role") for n in provenance["nodes"]] == ["gateway+worker", "worker", "index"]
    assert all(n["info"].get("model_source") for n in provenance["nodes"])
    for n in provenance["nodes"]:
        assert isinstance(n["settings"], dict) or (n["settings"] == "unknown" and n["settings_note"])
    assert len(provenance["tool"]["commit"]) == 40


@pytest.fixture
def decoys():
    """Three stand-in nodes that NODE_<n>_IP names: another cluster on this host, which a tool
    pointed at our cluster must not measure."""
    with ExitStack() as stack:
        yield [stack.enter_context(FakeNode()) for _ in range(3)]


def loadgen_process(url: str, out, decoys, *extra: str) -> subprocess.CompletedProcess:
    """`python -m profiling.loadgen --url URL` as its own process, its NODE_<n>_IP naming the decoys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODE_")}
    env.update({f"NODE_{n}_IP": d.url.removeprefix("http://") for n, d in enumerate(decoys)})
    return subprocess.run([sys.executable, "-m", "profiling.loadgen", "--url", url, "--concurrency", "1", "--count",
                           "1", "--out", str(out), "--wait-health", "30", "--max-duration", "120", "--no-plots",
                           "--name", "p", *extra], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


def test_a_loadgen_process_measures_the_cluster_its_url_names(cluster, decoys, tmp_path):
    done = loadgen_process(cluster.url(0), tmp_path, decoys)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "loadgen_p.json").read_text())
    assert summary["metrics_urls"] == [f"{cluster.url(n)}/metrics" for n in range(3)]
    assert [d.metrics_calls + d.health_calls + len(d.queries) for d in decoys] == [0, 0, 0]
    assert [n["node"] for n in summary["provenance"]["nodes"]] == [0, 1, 2]
    assert f"results in {tmp_path}" in done.stdout


def test_closed_loop_metrics_deltas(closed_run):
    _, _, summary = closed_run
    nodes = summary["nodes"]
    if any(n["error"] == "http_404" for n in nodes):
        pytest.skip("the nodes do not serve /metrics yet (404): batch-size deltas not checked")
    assert [n["error"] for n in nodes] == ["", "", ""]
    assert all(n["peak_rss_bytes"] > 0 for n in nodes)
    workers = {s["stage"]: 0 for s in nodes[0]["stages"]}
    below_one = set()
    for node in nodes[:2]:
        for s in node["stages"]:
            workers[s["stage"]] += s["items"]
            if s["batches"]:
                assert s["mean_batch_run_s"] > 0
                if not s["mean_batch_size"] >= 1:
                    below_one.add(s["stage"])
    # Every request went through every stage of exactly one worker, once.
    assert {stage: workers.get(stage) for stage in ("embed", "rerank", "generate", "toxicity")} == \
        {"embed": 6, "rerank": 6, "generate": 6, "toxicity": 6}
    index = {s["stage"]: s for s in nodes[2]["stages"]}["index"]
    assert index["items"] == 6  # one vector per request
    assert not below_one, f"mean batch size below 1 in {below_one}"


def test_open_loop_schedule(cluster, tmp_path):
    rc = run_loadgen(cluster, tmp_path, "--schedule", "3x1,3x0.5", "--time-scale", "0.2", "--name", "sched")
    assert rc == 0
    rows = read_csv(tmp_path / "loadgen_sched.csv")
    assert [r["group"] for r in rows] == ["3x1"] * 3 + ["3x0.5"] * 3
    assert all(r["status"] == "200" and r["error"] == "" for r in rows)
    first = [float(r["scheduled_s"]) for r in rows[:3]]
    assert [b - a for a, b in zip(first, first[1:])] == pytest.approx([0.2, 0.2], abs=1e-3)
    summary = json.loads((tmp_path / "loadgen_sched.json").read_text())
    assert [run["stats"]["ok"] for run in summary["runs"]] == [3, 3]
    assert summary["overall"]["ok"] == 6 and summary["overall"]["errors"] == {}
    check_percentiles(summary["overall"]["latency"])
    # The second phase starts after the first one's replies (the course client's runs are separate).
    first_done = max(float(r["send_s"]) + float(r["latency_s"]) for r in rows[:3])
    assert float(rows[3]["send_s"]) >= first_done


def test_closed_loop_stops_at_duration(cluster, tmp_path):
    # Each reply takes seconds, so with --duration 0.5 each client sends once and stops.
    rc = run_loadgen(cluster, tmp_path, "--concurrency", "2", "--count", "100", "--duration", "0.5",
                     "--name", "dur", "--no-plots")
    assert rc == 0  # a bound the caller chose is not a failure
    overall = json.loads((tmp_path / "loadgen_dur.json").read_text())["overall"]
    assert overall["planned"] == 100 and 2 <= overall["sent"] < 100 and overall["ok"] == overall["sent"]


def test_max_duration_is_a_hard_bound(cluster, tmp_path):
    # The cut requests may still be computing on the nodes afterwards: the shared cluster's fixture
    # waits for them before the next test.
    started = time.monotonic()
    rc = loadgen.main(["--url", cluster.url(0), "--metrics-urls", "none", "--schedule", "5x1",
                       "--max-duration", "1.5", "--out", str(tmp_path), "--name", "cut", "--no-plots"])
    assert time.monotonic() - started < 1.5 + JOIN_GRACE_S + 2
    assert rc == 1
    summary = json.loads((tmp_path / "loadgen_cut.json").read_text())
    assert summary["deadline_hit"] is True
    assert summary["overall"]["planned"] == 5 and summary["overall"]["sent"] == 2




def test_a_node_that_cannot_be_scraped_fails_loudly(cluster, decoys, tmp_path):
    # Node 2 is stopped, then started again. Node 0 still answers /health 200, so only the
    # scrape can tell that the figures would lack node 2; the decoys (NODE_<n>_IP) answer every
    # scrape, so a tool that fell back to them would pass.
    cluster.stop_node(2)
    try:
        done = loadgen_process(cluster.url(0), tmp_path, decoys)
    finally:
        cluster.start_node(2)
        cluster.wait_healthy(nodes=(2,), timeout_s=240)
    assert done.returncode == 1
    assert f"node 2 ({cluster.url(2)}/metrics)" in done.stderr and "ConnectionError" in done.stderr
    assert [d.metrics_calls for d in decoys] == [0, 0, 0]
    assert not list(tmp_path.iterdir())  # refused before any load: nothing half-measured was written
