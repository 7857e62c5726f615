"""Request ids, completion log lines, JSON logs and the metric families added for operability (no models)."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from flask import Flask, g, jsonify
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.continuous.output import Finish
from services.node import JsonFormatter
from services.roles.gateway.gateway import Gateway
from services.roles.gateway.metrics import GatewayCollector
from services.roles.worker.stage_clock import collect_stage_times
from services.server import completion
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.app import make_app
from services.server.edge import install_completion_log
from services.server.errors import Overloaded, RequestIdConflict
from services.server.metrics import InfoCollector, NodeMetrics
from services.server.request_ids import (
    MAX_REQUEST_ID_HEADER_CHARS,
    batch_request_ids,
    bind_request_id,
    current_request_id,
    header_form,
)
from services.stages.batch_stats import WAIT_BUCKETS, BatchCounters, with_observations
from services.stages.batching import BatchingService
from services.stages.continuous import ContinuousGenerationService
from tests.unit.test_continuous import FakeEngine, scrape
from tests.unit.test_gateway import FakeWorker, ask, gateway_settings

pytestmark = pytest.mark.timeout(60)


def samples(*collectors) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# ----------------------------------------------------------------------------- request id and completion line


def query_app() -> Flask:
    app = make_app("t")
    install_completion_log(app, also=("/query",))

    @app.post("/query")
    def query():
        seen = {"id": bind_request_id("body-id\nforged"), "forwarded_as": current_request_id.get()}
        record = g.completion = completion.begin()
        record.served_by, record.stages_ms = 1, {"embed": 1.5}
        return jsonify(seen)

    @app.post("/boom")
    def boom():
        raise Overloaded("full", retry_after_s=1)
    return app


def test_header_id_wins_is_returned_and_is_what_goes_to_other_nodes(caplog):
    client = query_app().test_client()
    with caplog.at_level(logging.INFO, logger="services.requests"):
        reply = client.post("/query", json={}, headers={"X-Request-ID": "abc-123"})
    assert reply.headers["X-Request-ID"] == "abc-123"
    assert reply.get_json() == {"id": "abc-123", "forwarded_as": "abc-123"}
    (record,) = caplog.records
    assert record.fields["id"] == "abc-123" and record.fields["status"] == 200 and record.fields["served_by"] == 1
    # repr: the body id's newline cannot start a forged line
    assert "\n" not in record.getMessage() and "request_id='body-id\\nforged'" in record.getMessage()
    assert "stages_ms=embed:1.5" in record.getMessage()


def test_a_streamed_answers_completion_line_comes_when_its_stream_ends_with_every_stage(caplog):
    from services.server.stream_response import sse_response
    app = make_app("t")
    install_completion_log(app, also=("/stream",))

    @app.post("/stream")
    def stream():
        g.completion = completion.begin()
        completion.note_stages({"embed": 1.0})

        def events():  # the later stages end while the stream is written
            yield AnswerPiece("piece")
            completion.note_stages({"generate": 2.0})
            yield FinalAnswer("s", "piece", "neutral", "false")
        return sse_response(events())

    with caplog.at_level(logging.INFO, logger="services.requests"):
        response = app.test_client().post("/stream", buffered=False)
        assert not caplog.records  # not at its first event
        body = response.get_data()
        response.close()
    assert b"event: reply" in body
    (record,) = caplog.records
    assert record.fields["status"] == 200 and record.fields["stages_ms"] == {"embed": 1.0, "generate": 2.0}


def test_without_a_header_the_body_id_is_used_in_header_form():
    reply = query_app().test_client().post("/query", json={})
    assert reply.headers["X-Request-ID"] == "body-id%0Aforged" == header_form("body-id\nforged")


def test_error_replies_carry_the_id_and_a_bad_header_is_refused():
    client = query_app().test_client()
    assert client.post("/boom", headers={"X-Request-ID": "x-1"}).headers["X-Request-ID"] == "x-1"
    bad = client.post("/query", json={}, headers={"X-Request-ID": "x" * (MAX_REQUEST_ID_HEADER_CHARS + 1)})
    assert bad.status_code == 400 and bad.get_json()["field"] == "X-Request-ID" and "X-Request-ID" not in bad.headers


def test_a_search_batch_names_its_requests_in_one_bounded_header():
    assert batch_request_ids(["a", "b,c", "d"]) == "a,b%2Cc,d"
    many = batch_request_ids([f"request-{i:04d}" for i in range(500)])
    assert len(many) <= MAX_REQUEST_ID_HEADER_CHARS and many.endswith(" more") and many.startswith("request-0000,")


def test_json_formatter_writes_one_object_with_the_common_and_request_fields():
    record = logging.LogRecord("services.requests", logging.INFO, __file__, 1, "done id=%r", ("a\nb",), None)
    record.fields = {"id": "a\nb", "status": 200}
    line = JsonFormatter(1).format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["node"] == 1 and entry["level"] == "INFO" and entry["logger"] == "services.requests"
    assert entry["message"] == "done id='a\\nb'" and entry["id"] == "a\nb" and entry["status"] == 200 and entry["time"]


def test_collect_stage_times_gives_each_request_a_fresh_dict():
    first = collect_stage_times()
    first["embed"] = 1.0
    assert collect_stage_times() == {}


# ----------------------------------------------------------------------------- metrics


def test_with_observations_counts_each_value_under_its_first_bound():
    counts = with_observations(BatchCounters().wait_bucket_counts, WAIT_BUCKETS, [0.0005, 0.001, 0.002, 1e6])
    assert counts[0] == 2 and counts[1] == 1 and counts[-1] == 1 and sum(counts) == 4


def test_queue_wait_and_tpot_histograms_move_as_requests_pass():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=8)
    embed = BatchingService("embed", lambda items: items, max_size=4, max_wait_ms=1)
    try:
        empty = scrape([embed, gen])
        assert empty[("rag_batch_queue_wait_seconds_count", (("stage", "embed"),))] == 0
        assert [f.result(timeout=10) for f in [gen.submit((5, 3)), gen.submit((5, 1))]] == [Finish.LENGTH] * 2
        assert embed.submit_many([1, 2, 3])[2].result(timeout=10) == 3
        m = scrape([embed, gen])
        for stage in ("embed", "generate"):
            label = (("stage", stage),)
            assert m[("rag_batch_queue_wait_seconds_count", label)] == m[("rag_batch_items_total", label)]
            assert m[("rag_batch_queue_wait_seconds_sum", label)] == m[("rag_batch_wait_seconds_total", label)]
            assert m[("rag_batch_queue_wait_seconds_bucket", (("le", "+Inf"),) + label)] == \
                m[("rag_batch_queue_wait_seconds_count", label)]
        g = (("stage", "generate"),)
        assert m[("rag_generate_tpot_seconds_count", g)] == 1  # the one-token answer has no time per token
        assert m[("rag_generate_tpot_seconds_sum", g)] >= 0
        assert ("rag_generate_tpot_seconds_count", (("stage", "embed"),)) not in m
    finally:
        gen.close(timeout=10)
        embed.close(timeout=10)


def test_node_info_is_one_with_its_labels():
    m = samples(InfoCollector(lambda: {"node": "1", "role": "worker", "model_source": "standin:tiny",
                                       "precision": "auto", "version": "0.1.0"}))
    assert m[("rag_node_info", (("model_source", "standin:tiny"), ("node", "1"),
                                ("precision", "auto"), ("role", "worker"), ("version", "0.1.0")))] == 1


def test_the_process_cpu_counter_sees_a_few_milliseconds():
    # The overhead floor divides a node's CPU over a handful of requests, too few for a counter of 10 ms ticks.
    registry = NodeMetrics().registry

    def cpu_seconds() -> float:
        return registry.get_sample_value("rag_process_cpu_seconds_total")

    # The clock read around the counter bounds it (other threads' CPU, e.g. OpenMP workers still spinning after an
    # earlier test's product, counts in both): 10 ms ticks would read 0 here or jump past the window.
    outer = time.process_time()
    before = cpu_seconds()
    start = time.process_time()
    while time.process_time() - start < 0.003:
        pass
    grown = cpu_seconds() - before
    window = time.process_time() - outer
    assert 0.003 <= grown <= window


def test_gateway_families_separate_local_work_from_forwards_and_count_admission():
    gate = threading.Event()
    local, remote = FakeWorker(0, gate=gate), FakeWorker(1, gate=gate)
    gw = Gateway([local.target(local=True), remote.target()],
                 gateway_settings(health_interval_s=3600, max_in_flight=2, max_joiners_per_id=1, max_joiners=1))
    collector = GatewayCollector(lambda: gw)
    try:
        threads = [threading.Thread(target=ask, args=(gw, f"r{i}", "q", 10)) for i in range(2)]
        threads.append(threading.Thread(target=ask, args=(gw, "r0", "q", 10)))  # joins r0
        for t in threads:
            t.start()
        with pytest.raises(Overloaded):  # both slots busy
            ask(gw, "r9", "q", 10)
        with pytest.raises(Overloaded):  # r0 has its one joiner already
            ask(gw, "r0", "q", 10)
        busy = samples(collector)
        assert busy[("rag_gateway_in_flight", ())] == 2 and busy[("rag_gateway_max_in_flight", ())] == 2
        assert busy[("rag_gateway_rejected_total", (("reason", "capacity"),))] == 1
        assert busy[("rag_gateway_rejected_total", (("reason", "joiners"),))] == 1
        gate.set()
        for t in threads:
            t.join(10)
        with pytest.raises(RequestIdConflict):  # same id, another query: 409
            ask(gw, "r1", "another", 10)
        m = samples(collector)
        assert m[("rag_gateway_in_flight", ())] == 0 and m[("rag_gateway_joined_total", ())] == 1
        assert m[("rag_gateway_conflicts_total", ())] == 1
        assert m[("rag_gateway_routed_total", (("local", "true"), ("worker", "0")))] == 1
        assert m[("rag_gateway_routed_total", (("local", "false"), ("worker", "1")))] == 1
        assert m[("rag_gateway_forwarded_total", (("worker", "1"),))] == 1
        assert ("rag_gateway_forwarded_total", (("worker", "0"),)) not in m  # in-process is not a forward
    finally:
        gate.set()
        gw.close()


def test_a_worker_rejoining_is_info_and_leaving_is_a_warning(caplog):
    target = FakeWorker(1).target()  # up, and its probe agrees: whenever the first probe runs, it logs nothing
    gw = Gateway([target], gateway_settings(health_interval_s=3600))
    try:
        with caplog.at_level(logging.INFO, logger="services.roles.gateway.routing"):
            gw.router.mark(target, False, "gone")
            gw.router.mark(target, True, "health probe")
        levels = {r.getMessage().split(":")[0]: r.levelno for r in caplog.records if "rotation" in r.getMessage()}
        assert levels == {"worker node 1 rejoins the rotation": logging.INFO,
                          "worker node 1 leaves the rotation": logging.WARNING}
    finally:
        gw.close()
