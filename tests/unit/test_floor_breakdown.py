"""The overhead floor's components: completion lines parsed as the edge writes them, and each component's
arithmetic from the lines and the stages' counters (the tool itself runs in
tests/integration/test_overhead_floor.py against a real null-mode cluster)."""
from __future__ import annotations

import logging
import math

import pytest
from flask import Flask, g

from profiling.lib.floor_breakdown import breakdown, critical_path_ms, parse_completions, unlogged
from profiling.lib.prometheus import MetricsSnapshot
from services.server import completion
from services.server.edge import EDGE_ROUTE, install_completion_log


def test_completion_lines_are_parsed_as_the_edge_writes_them(caplog):
    app = Flask(__name__)

    @app.post("/query")
    def query():
        g.request_started, g.request_id, g.trace_id = 0.0, "req-1", "t"
        record = g.completion = completion.begin()
        record.served_by = 1
        record.stages_ms.update({"embed": 1.5, "generate": 40.0})
        g.response_status = 200
        return "{}"

    setattr(query, EDGE_ROUTE, True)
    install_completion_log(app)
    with caplog.at_level(logging.INFO, logger="services.requests"):
        app.test_client().post("/query", json={})
    lines = parse_completions("\n".join(r.getMessage() for r in caplog.records) + "\nnoise line\n")
    assert len(lines) == 1
    line = lines[0]
    assert (line.request_id, line.endpoint, line.status, line.served_by) == ("req-1", "/query", 200, 1)
    assert line.stages_ms == {"embed": 1.5, "generate": 40.0} and line.latency_ms > 0


def test_a_line_without_stages_parses_with_none():
    [line] = parse_completions("request done id='x' request_id=None /internal/answer status=503 latency_ms=2.0 "
                               "served_by=None stages_ms=-")
    assert (line.request_id, line.status, line.served_by, line.stages_ms) == ("None", 503, None, {})


def test_an_answered_request_is_unlogged_until_each_node_it_passed_wrote_its_answered_line():
    def line(rid: str, endpoint: str, status: int = 200, served_by: int | None = None) -> str:
        return (f"request done id='x' request_id={rid!r} {endpoint} status={status} latency_ms=2.0 "
                f"served_by={served_by} stages_ms=-")

    node0 = parse_completions("\n".join([line("own", "/query", served_by=0), line("relayed", "/query", served_by=1),
                                         line("failed-here", "/query", status=503, served_by=0)]))
    asked = ["own", "relayed", "failed-here", "unseen"]
    assert unlogged(asked, node0, []) == ["relayed", "failed-here", "unseen"]
    node1 = parse_completions(line("relayed", "/internal/answer"))
    assert unlogged(asked, node0, node1) == ["failed-here", "unseen"]
    assert unlogged(["own", "relayed"], node0, node1) == []


def test_the_critical_path_takes_the_longer_classifier():
    assert critical_path_ms({"embed": 1, "search": 2, "fetch": 3, "rerank": 4, "generate": 10,
                             "sentiment": 5, "toxicity": 7}) == 27


def _snapshot(**stages: dict[str, float]) -> MetricsSnapshot:
    samples = {}
    for stage, values in stages.items():
        for name, value in values.items():
            samples[(name, (("stage", stage),))] = value
    return MetricsSnapshot("m", samples)


def test_components_are_the_lines_and_counters_differences():
    from profiling.lib.floor_breakdown import CompletionLine
    stages = {"embed": 4.0, "search": 6.0, "fetch": 1.0, "rerank": 1.0, "generate": 100.0,
              "sentiment": 3.0, "toxicity": 2.0}
    node0 = [CompletionLine("a", "/query", 200, 130.0, 0, stages),
             CompletionLine("b", "/query", 200, 140.0, 1, stages)]
    node1 = [CompletionLine("b", "/internal/answer", 200, 125.0, 1, stages)]
    zero = [_snapshot(), _snapshot(), _snapshot()]
    worker = _snapshot(embed={"rag_batch_wait_seconds_total": 0.004, "rag_batch_items_total": 2,
                              "rag_batch_run_seconds_total": 0.002, "rag_batches_total": 2},
                       generate={"rag_batch_wait_seconds_total": 0.002, "rag_batch_items_total": 2,
                                 "rag_batch_run_seconds_total": 0.1, "rag_generate_decode_steps_total": 200,
                                 "rag_generate_tokens_total": 200, "rag_generate_finished_sequences_total": 2})
    out = breakdown({"a": 135.0, "b": 150.0}, node0, node1, zero, [worker, _snapshot(), _snapshot()])
    assert out["requests (count)"] == 2 and out["served by node 1 (count)"] == 1
    assert out["client and HTTP to node 0"] == pytest.approx(7.5)  # (5 + 10) / 2
    assert out["node 0: edge and routing (own worker's requests)"] == pytest.approx(130 - 115)
    assert out["relay to node 1"] == pytest.approx(15)
    assert out["node 1: edge and worker outside stages"] == pytest.approx(10)
    assert (out["embed: queue wait"], out["embed: batch run"], out["embed: handoff"]) == \
        pytest.approx((2.0, 1.0, 1.0))
    assert out["generate: engine step (mean)"] == pytest.approx(0.5)
    assert out["generate: steps per request"] == pytest.approx(100)
    assert out["generate: handoff"] == pytest.approx(100 - 1 - 50)
    assert math.isnan(out["rerank: queue wait"])  # no counters: unknown, not zero


def test_each_nodes_cpu_per_request_is_its_process_cpu_seconds_over_the_level_per_request_answered():
    def cpu(seconds: float) -> MetricsSnapshot:
        return MetricsSnapshot("m", {("rag_process_cpu_seconds_total", ()): seconds})

    out = breakdown({"a": 10.0, "b": 12.0}, [], [], [cpu(1.0), cpu(1.0), cpu(0.5)], [cpu(1.3), cpu(1.2), cpu(0.6)])
    assert [out[f"node {n}: CPU ms per request"] for n in range(3)] == pytest.approx([150, 100, 50])
    assert out["nodes: CPU ms per request"] == pytest.approx(300)
    unknown = breakdown({"a": 10.0}, [], [], [_snapshot()] * 3, [_snapshot()] * 3)  # no such counter: unknown
    assert math.isnan(unknown["node 0: CPU ms per request"]) and math.isnan(unknown["nodes: CPU ms per request"])
