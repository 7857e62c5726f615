"""One request's trace across three real nodes (TRACING=jsonl, one span file per node):
node 0's server and client spans, node 1's server span, its seven stage spans, its call to node 2
and node 2's /search server span, all in one trace with the right parents; and its X-Request-ID
back on the reply, in each node's completion line (LOG_FORMAT=json) and on each node's server span.
On the shared cluster, whose span files and logs hold other tests' requests too."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from pipeline import spec
from tests.helpers import uid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NODES = (0, 1, 2)
STAGES = {str(stage) for stage in spec.WORKER_STAGES}
SPAN_WAIT_S = 30  # spans are written as they end; this only bounds a failing test


@pytest.fixture(scope="module")
def traced(shared_cluster):
    """The cluster, each node appending its spans to a file of its own (TRACING=jsonl)."""
    assert shared_cluster.env["TRACING"] == "jsonl" and shared_cluster.env["LOG_FORMAT"] == "json"
    return shared_cluster, {node: shared_cluster.trace_path(node) for node in NODES}


def spans_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trace_of(files: dict[int, Path], request_id: str, expect: dict[int, int]) -> dict[int, list[dict]]:
    """Each node's spans of the trace whose node 0 server span carries request_id, once every node
    in `expect` holds at least that many of them (bounded wait: the files are written per span)."""
    deadline = time.monotonic() + SPAN_WAIT_S
    while True:
        spans = {node: spans_of(path) for node, path in files.items()}
        roots = [s for s in spans[0] if s["kind"] == "SERVER" and s["attributes"].get("rag.request_id") == request_id]
        if roots:
            trace_id = roots[0]["trace_id"]
            mine = {node: [s for s in found if s["trace_id"] == trace_id] for node, found in spans.items()}
            if all(len(mine[node]) >= count for node, count in expect.items()):
                return mine
        if time.monotonic() > deadline:
            raise AssertionError(f"the spans of {request_id!r} did not all appear within {SPAN_WAIT_S}s: "
                                 f"{ {node: len(found) for node, found in spans.items()} }")
        time.sleep(0.1)


def one(spans: list[dict], name: str, kind: str) -> dict:
    found = [s for s in spans if s["name"] == name and s["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} span {name!r}, got {found}"
    return found[0]


def ask(cluster, request_id: str, query: str) -> dict:
    # The header's id differs from the body's: the header's is the one followed across nodes.
    reply = requests.post(f"{cluster.url(0)}/query", json={"request_id": f"body-{request_id}", "query": query},
                          headers={"X-Request-ID": request_id}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.headers["X-Request-ID"] == request_id and reply.json()["request_id"] == f"body-{request_id}"
    return reply.json()


@pytest.fixture(scope="module")
def served(traced):
    """Request ids served by node 1 and by node 0 (round robin alternates; a few tries at most)."""
    cluster, _ = traced
    by_node: dict[int, str] = {}
    for n in range(6):
        request_id = uid(f"trace{n}")
        # A new query each time: an embedding cache hit would skip the embed stage.
        by_node.setdefault(ask(cluster, request_id, f"How do I return item number {request_id}?")["served_by"],
                           request_id)
        if {0, 1} <= set(by_node):
            return by_node
    raise AssertionError(f"round robin never reached both workers: {by_node}")


def check_stages(spans: list[dict], parent: dict, request_id: str) -> dict[str, dict]:
    """Exactly one span per stage, children of the request's server span, each inside it."""
    children = [s for s in spans if s["parent_span_id"] == parent["span_id"] and s["kind"] == "INTERNAL"]
    assert sorted(s["name"] for s in children) == sorted(STAGES)
    stages = {s["name"]: s for s in children}
    for span in stages.values():
        assert span["attributes"]["rag.request_id"] == request_id and span["status"] != "ERROR"
        # inside the request's own span
        assert parent["start_time_ns"] <= span["start_time_ns"] <= span["end_time_ns"] <= parent["end_time_ns"]
        # the batch it ran in (continuous generate: the running batch it joined), and its wait for it
        assert span["attributes"]["rag.batch_size"] >= 1 and span["attributes"]["rag.queue_wait_ms"] >= 0
    return stages


def test_a_request_served_by_node_1_is_one_trace_across_the_three_nodes(traced, served):
    _, files = traced
    request_id = served[1]
    spans = trace_of(files, request_id, {0: 2, 1: 1 + len(STAGES) + 1, 2: 2})
    gateway = one(spans[0], "POST /query", "SERVER")
    forward = one(spans[0], "POST /internal/answer", "CLIENT")
    worker = one(spans[1], "POST /internal/answer", "SERVER")
    search_call = one(spans[1], "POST /search", "CLIENT")
    index = one(spans[2], "POST /search", "SERVER")

    assert len({gateway["trace_id"], forward["trace_id"], worker["trace_id"], search_call["trace_id"],
                index["trace_id"]}) == 1
    assert gateway["parent_span_id"] is None  # the client sent no traceparent
    assert forward["parent_span_id"] == gateway["span_id"]
    assert worker["parent_span_id"] == forward["span_id"]  # the traceparent crossed node 0 -> 1
    stages = check_stages(spans[1], worker, request_id)
    assert search_call["parent_span_id"] == stages["search"]["span_id"]
    assert index["parent_span_id"] == search_call["span_id"]  # ... and node 1 -> 2
    index_stage = one(spans[2], "index", "INTERNAL")
    assert index_stage["parent_span_id"] == index["span_id"]

    assert gateway["attributes"]["rag.request_id"] == worker["attributes"]["rag.request_id"] == request_id
    assert gateway["attributes"]["rag.served_by"] == worker["attributes"]["rag.served_by"] == 1
    assert gateway["attributes"]["http.response.status_code"] == 200 and gateway["attributes"]["http.route"] == "/query"
    assert forward["attributes"]["http.response.status_code"] == 200
    assert [s["node"] for s in (gateway, worker, index)] == [0, 1, 2]
    assert request_id in index["attributes"]["rag.request_id"].split(",")  # the batch's ids, as node 2 got them
    # node 0 computed nothing of it
    assert not [s for s in spans[0] if s["name"] in STAGES]


def test_a_request_node_0_serves_itself_has_its_stages_under_node_0s_server_span(traced, served):
    _, files = traced
    request_id = served[0]
    spans = trace_of(files, request_id, {0: 1 + len(STAGES) + 1, 2: 2})
    gateway = one(spans[0], "POST /query", "SERVER")
    assert gateway["attributes"]["rag.served_by"] == 0
    stages = check_stages(spans[0], gateway, request_id)
    search_call = one(spans[0], "POST /search", "CLIENT")
    assert search_call["parent_span_id"] == stages["search"]["span_id"]
    assert one(spans[2], "POST /search", "SERVER")["parent_span_id"] == search_call["span_id"]
    assert not spans[1] and not [s for s in spans[0] if s["name"] == "POST /internal/answer"]


def completion_lines(cluster, node: int) -> list[dict]:
    """The node's services.requests lines (LOG_FORMAT=json: one object a line)."""
    lines = [json.loads(line) for line in cluster.log_path(node).read_text().splitlines() if line.strip()]
    return [e for e in lines if e["logger"] == "services.requests"]


def test_the_request_id_is_in_each_nodes_completion_line(traced, served):
    cluster, _ = traced
    request_id = served[1]
    (line0,) = [e for e in completion_lines(cluster, 0) if e.get("id") == request_id]
    (line1,) = [e for e in completion_lines(cluster, 1) if e.get("id") == request_id]
    assert line0["served_by"] == line1["served_by"] == 1 and line0["status"] == line1["status"] == 200
    assert line0["request_id"] == line1["request_id"] == f"body-{request_id}"
    # node 1 computed it: its stage times, which its reply brought node 0 for its own line
    assert set(line1["stages_ms"]) == STAGES and line0["stages_ms"] == line1["stages_ms"]
    # node 2: one line per search batch, naming the batch's requests
    assert any(request_id in str(e.get("id")).split(",") for e in completion_lines(cluster, 2))
