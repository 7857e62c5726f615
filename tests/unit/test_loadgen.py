"""profiling.loadgen and the library parts it runs on (profiling.lib): the pure parts, no cluster;
and --api openai (profiling/lib/load.py's ChatLoad): the /v1/chat/completions body each request
sends, with sampling, and how its reply is checked, against a node on 127.0.0.1 that records it."""
from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline import spec
from profiling import loadgen
from profiling.lib import cli, load, prometheus, report
from profiling.lib.load import ChatLoad

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


def test_each_mode_names_its_run_by_its_own_options_alone():
    def name(*argv):
        args = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", *argv])
        return loadgen.default_name(args, loadgen.plan_groups(args)[0])

    # A closed loop has no --rate: its name must not read it.
    assert name("--concurrency", "8", "--count", "32") == "closed-c8"
    assert name("--rate", "0.5", "--count", "4") == "rate0.5"
    assert name("--sweep", "1,2", "--count-per-level", "2") == "sweep"
    assert name("--concurrency", "8", "--count", "32", "--name", "mine") == "mine"


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
# TYPE rag_generate_decode_steps counter
rag_generate_decode_steps_total{stage="generate"} 100
# TYPE rag_generate_step_sequences histogram
rag_generate_step_sequences_sum{stage="generate"} 250
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
# TYPE rag_generate_decode_steps counter
rag_generate_decode_steps_total{stage="generate"} 400
# TYPE rag_generate_step_sequences histogram
rag_generate_step_sequences_sum{stage="generate"} 1450
"""


def test_metrics_deltas():
    before = prometheus.MetricsSnapshot("u", prometheus.parse_metrics(METRICS_BEFORE))
    after = prometheus.MetricsSnapshot("u", prometheus.parse_metrics(METRICS_AFTER))
    node = prometheus.node_delta(before, after)
    (stage,) = node.stages
    assert (stage.stage, stage.batches, stage.items) == ("generate", 3, 12)
    assert stage.mean_batch_size == 4 and stage.mean_batch_run_s == 10 and stage.mean_item_wait_s == 0.5
    assert (stage.decode_steps, stage.step_sequences) == (300, 1200)  # the engine's steps during the run
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


# ---------------------------------------------------------------- the cluster a tool measures (issue 14)

def test_nodes_come_from_node_0s_health():
    from profiling.lib.prometheus import ClusterError, Node, nodes_from_health
    health = {"status": "healthy", "node": 0, "role": "gateway+worker",
              "peers": [{"node": 2, "role": "index", "url": "http://127.0.0.1:19202"},
                        {"node": 1, "role": "worker", "url": "http://127.0.0.1:19201"}]}
    nodes = nodes_from_health("http://127.0.0.1:19200/", health)
    assert nodes == [Node(0, "http://127.0.0.1:19200", "gateway+worker"), Node(1, "http://127.0.0.1:19201", "worker"),
                     Node(2, "http://127.0.0.1:19202", "index")]
    assert [n.metrics_url for n in nodes][2] == "http://127.0.0.1:19202/metrics"
    with pytest.raises(ClusterError, match="--metrics-urls"):  # an older node 0: say what to do
        nodes_from_health("http://127.0.0.1:19200", {"status": "healthy", "node": 0})
    remote = {**health, "peers": [{"node": 1, "url": "http://10.0.0.11:8000"}]}
    with pytest.raises(ClusterError, match="node 1.*10.0.0.11"):  # loopback only, unless allowed
        nodes_from_health("http://127.0.0.1:19200", remote)
    assert nodes_from_health("http://127.0.0.1:19200", remote, allow_remote=True)[1].url == "http://10.0.0.11:8000"


def test_gateway_health_lists_its_peers():
    from types import SimpleNamespace

    from pipeline.config import Settings
    from services.roles.gateway.role import GatewayRole
    settings = Settings.from_env({"NODE_0_IP": "127.0.0.1:19200", "NODE_1_IP": "127.0.0.1:19201",
                                  "NODE_2_IP": "127.0.0.1:19202"})
    peers = GatewayRole.peers(SimpleNamespace(settings=settings, node=0))
    assert peers == [{"node": 1, "role": "worker", "url": "http://127.0.0.1:19201"},
                     {"node": 2, "role": "index", "url": "http://127.0.0.1:19202"}]


def test_a_node_that_cannot_be_scraped_is_named():
    from profiling.lib.prometheus import ClusterError, Node, scrape_nodes
    from tools.local import free_ports
    port = free_ports(1)[0]  # free now: nothing answers there
    with pytest.raises(ClusterError) as caught:
        scrape_nodes([Node(2, f"http://127.0.0.1:{port}", "index")], timeout_s=2)
    assert f"node 2 (http://127.0.0.1:{port}/metrics): ConnectionError" in str(caught.value)


def test_cache_warnings_only_where_a_cache_can_answer_a_repeat():
    from profiling.lib.prometheus import Node
    from profiling.lib.provenance import cache_warnings, queries_repeat
    nodes = [Node(0, "u0", "gateway+worker"), Node(1, "u1", "worker"), Node(2, "u2", "index")]
    on = {"EMBED_CACHE_SIZE": "1024", "RESPONSE_CACHE_SIZE": "0"}
    off = {"EMBED_CACHE_SIZE": "0", "RESPONSE_CACHE_SIZE": "0"}
    eight = [f"q{i}" for i in range(8)]
    assert queries_repeat(eight, 9) and not queries_repeat(eight, 8) and queries_repeat(["a", "b", "a"], 3)
    assert cache_warnings(nodes, [on, on, on], eight, 8) == []  # no query sent twice
    lines = cache_warnings(nodes, [on, on, on], eight, 32)
    # node 2 has no cache whatever its environment says; node 0's reply cache is off
    assert [line.split(":")[0] for line in lines] == ["node 0", "node 1"]
    assert all("EMBED_CACHE_SIZE=1024" in line and "8 distinct queries, 32 requests" in line for line in lines)
    assert cache_warnings(nodes, [off, off, off], eight, 32) == []
    reply = cache_warnings(nodes, [{**off, "RESPONSE_CACHE_SIZE": "64"}, off, off], eight, 32)
    assert len(reply) == 1 and "node 0: RESPONSE_CACHE_SIZE=64" in reply[0]
    unknown = cache_warnings(nodes, [None, None, None], eight, 32)
    assert [line.split(":")[0] for line in unknown] == ["node 0", "node 1"] and "unknown" in unknown[0]


def test_settings_record_falls_back_when_a_node_has_no_settings_endpoint(monkeypatch, tool_commit):
    from profiling.lib import provenance
    from profiling.lib.prometheus import MetricsSnapshot, Node
    from tests.fake_node import FakeNode
    info = MetricsSnapshot("m", {("rag_node_info", (("model_source", "standin"), ("node", "0"),
                                                    ("precision", "exact"), ("version", "0.9"))): 1.0})
    with FakeNode() as node:  # answers 404 on /settings, like a node older than it
        record = provenance.cluster_record([Node(0, node.url)], [info])
    (entry,) = record["nodes"]
    assert entry["settings"] == "unknown" and "404" in entry["settings_note"]
    assert entry["info"] == {"model_source": "standin", "node": "0", "precision": "exact", "version": "0.9"}
    assert "node 0's settings are unknown" in provenance.settings_warnings(record)[0]
    assert record["tool"] == tool_commit  # the tool's own commit (provenance.git_commit)
    assert "settings unknown" in provenance.headline(record) and "version=0.9" in provenance.headline(record)

    class Answer:  # what a node with GET /settings says
        status_code = 200

        @staticmethod
        def json():
            return {"settings": {"EMBED_CACHE_SIZE": "0", "CLUSTER_TOKEN": "<hidden>"}}

    monkeypatch.setattr(provenance.requests, "get", lambda url, **kw: Answer())
    values, why = provenance.fetch_settings(Node(1, "http://127.0.0.1:1"))
    assert (values, why) == ({"EMBED_CACHE_SIZE": "0", "CLUSTER_TOKEN": "<hidden>"}, "")


def test_in_process_tools_record_their_own_settings_with_secrets_hidden(tool_commit):
    from profiling.lib.provenance import local_record
    record = local_record({"CLUSTER_TOKEN": "s3cret", "EMBED_CACHE_SIZE": "0", "PRECISION": "fast"})
    values = record["settings"]
    assert values["CLUSTER_TOKEN"] == "<hidden>" and "s3cret" not in json.dumps(record)
    assert (values["EMBED_CACHE_SIZE"], values["PRECISION"], values["TORCH_THREADS"]) == ("0", "fast", "0")
    assert record["tool"] == tool_commit


def test_sweep_levels_too_small_to_judge_and_their_spread():
    def stats(ok: int, rpm: float, p95: float) -> report.RunStats:
        return report.RunStats("x", ok, ok, ok, {}, 60.0, rpm, report.LatencyStats(ok, p95, p95, p95, p95, p95), 0.0, {})

    small = report.find_saturation([1, 2, 4], [stats(4, 10, 6), stats(25, 19, 6.3), stats(4, 20, 13)])
    assert small.reached and small.small_levels == (1, 4) and not small.judgeable
    warning = report.small_sample_warning(small)
    assert "c=1,4" in warning and f"fewer than {report.MIN_SWEEP_SAMPLE}" in warning and "tentative" in warning
    enough = report.find_saturation([1, 2], [stats(20, 10, 6), stats(30, 19, 6.3)])
    assert enough.judgeable and report.small_sample_warning(enough) == ""

    spread = report.LatencyStats.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (spread.min_s, spread.p5_s, spread.p50_s, spread.max_s) == pytest.approx((1.0, 1.2, 3.0, 5.0))
    assert spread.stdev_s == pytest.approx(1.5811, abs=1e-4)
    assert math.isnan(report.LatencyStats.of([2.0]).stdev_s)
    table = report.format_spread_table([report.run_stats("c1", 1, [load.RequestRecord("r", "c1", 0, 0, 0, 2.5, 200)])])
    assert "stdev s" in table and table.splitlines()[-1].split()[:3] == ["c1", "1", "2.50"]


def test_output_folders_are_fresh_per_run(tmp_path):
    moment = 1704164645.0  # 2024-01-02 03:04:05 UTC
    first = report.run_folder("loadgen", now=moment, runs_dir=tmp_path)
    second = report.run_folder("loadgen", now=moment, runs_dir=tmp_path)  # same second: not the same folder
    assert (first.name, second.name) == ("loadgen-20240102T030405Z", "loadgen-20240102T030405Z-2")
    assert first.is_dir() and second.is_dir()
    chosen = report.run_folder("loadgen", tmp_path / "mine", now=moment, runs_dir=tmp_path)
    assert chosen == tmp_path / "mine" and chosen.is_dir()  # --out: exactly where the user said


def test_an_output_folder_given_relative_is_returned_absolute(tmp_path, monkeypatch):
    # Tools hand it to processes started in another folder (a --compare commit's checkout).
    monkeypatch.chdir(tmp_path)
    chosen = report.run_folder("overhead_floor", "runs/mine")
    assert chosen.is_absolute() and chosen == tmp_path / "runs" / "mine" and chosen.is_dir()


def test_loadgen_sweep_records_warnings_settings_and_a_fresh_folder(tmp_path, monkeypatch, capsys, tool_commit):
    from tests.fake_node import FakeNode
    monkeypatch.chdir(tmp_path)  # no --out: runs/loadgen-<UTC time>/ under the working directory
    with FakeNode() as node:
        rc = loadgen.main(["--url", node.url, "--metrics-urls", f"{node.url}/metrics", "--sweep", "1,2",
                           "--count-per-level", "5", "--max-duration", "20", "--name", "s", "--no-plots"])
    assert rc == 0
    (out,) = (tmp_path / "runs").iterdir()
    assert out.name.startswith("loadgen-") and out.name.endswith("Z")
    printed = capsys.readouterr()
    assert f"results in {out}" in printed.out  # the absolute folder: runs/ under the working directory
    assert "too few successful requests to judge the knee at c=1,2" in printed.out and "(tentative" in printed.out
    assert "min s" in printed.out and "stdev s" in printed.out
    summary = json.loads((out / "loadgen_s.json").read_text())
    assert summary["saturation"]["small_levels"] == [1, 2] and summary["min_sweep_sample"] == 20
    assert all(run["stats"]["latency"]["min_s"] > 0 for run in summary["runs"])
    warnings = summary["warnings"]
    assert any("settings are unknown" in w and "404" in w for w in warnings)  # the fake node has no /settings
    assert any("cache settings unknown" in w and "10 requests planned" in w for w in warnings)
    assert any("too few successful requests" in w for w in warnings)
    assert summary["provenance"]["nodes"][0]["settings"] == "unknown"
    assert summary["provenance"]["tool"] == tool_commit


def test_a_streamed_request_is_timed_to_its_first_piece_and_between_pieces():
    """LoadTarget(stream=True) against an SSE node whose pieces come 50 ms apart after 200 ms."""
    from services.server import sse
    from tests.unit.test_client import StreamingNode, reply_for

    def script(body):
        time.sleep(0.2)  # the server's own pace, what the client measures
        for piece in ("Answer:", " return", " it"):
            yield sse.token_event(piece)
            time.sleep(0.05)
        yield sse.reply_event({**reply_for(body), "generated_response": "Answer: return it"})

    with StreamingNode(script) as node:
        target = load.LoadTarget(node.url, ["q"], timeout_s=10, deadline=time.monotonic() + 30, stream=True)
        record = target.send(target.record("s", 0, 0.0))
    assert record.ok and record.pieces == 3 and record.served_by == "1"
    assert 0.2 <= record.ttft_s < record.latency_s
    assert 0.04 <= record.itl_s < 0.5
    stats = report.run_stats("s", 1, [record])
    assert stats.ttft.count == 1 and stats.ttft.p50_s == record.ttft_s and stats.itl.p50_s == record.itl_s


# ---------------------------------------------------------------- --api openai


def test_the_body_names_the_model_the_query_and_a_seed_per_request():
    body = ChatLoad(temperature=0.7, seed_base=100, max_tokens=64).body("lg-1", "Where is my order?", 3, True)
    assert body == {"model": spec.GENERATOR_MODEL, "request_id": "lg-1", "temperature": 0.7, "seed": 103,
                    "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Where is my order?"}]}
    assert set(ChatLoad().body("lg-2", "q", 0, False)) == {"model", "request_id", "messages"}  # the server's defaults


def test_the_command_line_picks_the_api_and_its_fields():
    args = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--concurrency", "2", "--count", "4",
                                        "--api", "openai", "--temperature", "0.7", "--seed-base", "5"])
    assert loadgen.chat_load(args) == ChatLoad(0.7, 5, None)
    plain = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--concurrency", "2", "--count", "4"])
    assert loadgen.chat_load(plain) is None


class RecordingNode:
    """POST /v1/chat/completions on 127.0.0.1: records each body and answers a chat.completion for it."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append({"path": self.path, **body})
                reply = json.dumps({"choices": [{"message": {"content": "Returns take 30 days."}}],
                                    "rag": {"request_id": body["request_id"]}, "seed": body.get("seed")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_sampled_load_request_sends_its_fields_and_checks_the_reply():
    node = RecordingNode()
    try:
        target = load.LoadTarget(node.url, ["q0", "q1"], timeout_s=5, deadline=time.monotonic() + 10,
                                 chat=ChatLoad(temperature=0.7, seed_base=40))
        records = [target.send(target.record("g", i, 0.0)) for i in range(2)]
    finally:
        node.close()
    assert all(r.ok and r.status == 200 for r in records)
    assert [(b["path"], b["messages"][0]["content"], b["seed"], b["temperature"]) for b in node.bodies] == [
        ("/v1/chat/completions", "q0", 40, 0.7), ("/v1/chat/completions", "q1", 41, 0.7)]
