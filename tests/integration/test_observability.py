"""One request followed across real nodes: X-Request-ID, completion log lines (one per request on every
public route, streamed or not, with served_by and stage times), JSON logs, new metric families. On the
shared cluster (LOG_FORMAT=json), whose logs hold other tests' lines too: each test finds its own by id."""
from __future__ import annotations

import json

import pytest
import requests

from pipeline import spec
from pipeline.config import Settings
from services.server import sse
from tests.helpers import uid, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def log_lines(cluster, node: int) -> list[dict]:
    """Every line of the node's log as JSON (json.loads fails the test on any line that is not)."""
    return [json.loads(line) for line in cluster.log_path(node).read_text().splitlines() if line.strip()]


def completions(cluster, node: int, request_id: str) -> list[dict]:
    return [e for e in log_lines(cluster, node) if e["logger"] == "services.requests" and e.get("id") == request_id]


def completion(cluster, node: int, request_id: str) -> dict:
    """The node's one completion line of the request, once written: a streamed answer's line (node 1
    streams to node 0) is written after its last event has left, so it may trail the reply the
    caller already has (bounded wait)."""
    wait_until(lambda: completions(cluster, node, request_id), 10, f"node {node} logged no line for {request_id}")
    (line,) = completions(cluster, node, request_id)
    return line


def ask(cluster, header_id: str, body_id: str, query: str | None = None) -> requests.Response:
    # A question no earlier request asked (by default): its embedding is computed, not cached, so the
    # embed stage runs and shows in the completion line.
    query = query or f"How do I return item {uid('q')}?"
    return requests.post(f"{cluster.url(0)}/query", json={"request_id": body_id, "query": query},
                         headers={"X-Request-ID": header_id}, timeout=120)


def test_request_id_comes_back_and_each_node_logs_one_completion_line(cluster):
    # Round robin: of two new requests one is node 0's own, the other node 1's.
    body_ids = {uid(f"abc{n}"): uid(f"body{n}") for n in range(2)}
    replies = {header_id: ask(cluster, header_id, body_id) for header_id, body_id in body_ids.items()}
    for header_id, reply in replies.items():
        assert reply.status_code == 200 and reply.headers["X-Request-ID"] == header_id
    by_node = {reply.json()["served_by"]: header_id for header_id, reply in replies.items()}
    assert set(by_node) == {0, 1}
    remote = by_node[1]
    line0, line1 = completion(cluster, 0, remote), completion(cluster, 1, remote)
    assert line0["status"] == line1["status"] == 200 and line0["served_by"] == line1["served_by"] == 1
    assert line1["request_id"] == body_ids[remote]
    assert set(line1["stages_ms"]) >= {"embed", "search", "fetch", "rerank", "generate", "sentiment", "toxicity"}
    local = by_node[0]
    own = completion(cluster, 0, local)
    assert own["served_by"] == 0 and "generate" in own["stages_ms"]
    assert not completions(cluster, 1, local)
    # node 2 logs one line per search batch, naming the batch's requests (a search sent without one has no id)
    wait_until(lambda: any(local in str(e.get("id")).split(",") for e in log_lines(cluster, 2)
                           if e["logger"] == "services.requests"), 10, "node 2 logged no line naming the request")


STAGES = {"embed", "search", "fetch", "rerank", "generate", "sentiment", "toxicity"}


def test_every_public_request_writes_one_completion_line_with_served_by_and_its_stages_streamed_or_not(cluster):
    url = cluster.url(0)

    def question() -> str:  # a text no earlier request asked: its embedding is computed, not cached
        return f"How do I return item {uid('q')}?"

    chat = {"model": spec.GENERATOR_MODEL, "max_tokens": 8}
    text = {"model": spec.GENERATOR_MODEL, "max_tokens": 8}
    asks = [("/query", {"request_id": uid("plain"), "query": question()}),
            ("/query", {"request_id": uid("streamed"), "query": question(), "stream": True}),
            ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": question()}]}),
            ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": question()}], "stream": True}),
            ("/v1/completions", {**text, "prompt": question()}),
            ("/v1/completions", {**text, "prompt": question(), "stream": True}),
            ("/v1/embeddings", {"model": spec.EMBEDDER_MODEL, "input": [question(), question()]})]
    ids = []
    for path, body in asks:
        ids.append(uid("line"))
        with requests.post(f"{url}{path}", json=body, headers={"X-Request-ID": ids[-1]}, timeout=120,
                           stream=bool(body.get("stream"))) as response:
            assert response.status_code == 200, (path, response.text[:300])
            if body.get("stream"):  # read to its end: the line comes once the stream is done
                events = list(sse.iter_events(sse.iter_lines(response.iter_content(chunk_size=None))))
                assert events[-1].name == "reply" or events[-1].data == "[DONE]", path
    for (path, _body), request_id in zip(asks, ids):
        line = completion(cluster, 0, request_id)
        assert line["endpoint"] == path and line["status"] == 200
        if path == "/v1/embeddings":  # node 0's own worker embeds
            assert line["served_by"] == 0 and set(line["stages_ms"]) == {"embed"}
        else:  # computed here or on node 1: the stages come back with the reply
            assert line["served_by"] in (0, 1) and set(line["stages_ms"]) >= STAGES, (path, line)


def test_error_replies_carry_the_id_and_the_body_id_stands_in_for_a_missing_header(cluster):
    header_id, body_id = uid("e"), uid("no-header")
    bad = requests.post(f"{cluster.url(0)}/query", json={"request_id": uid("err")}, headers={"X-Request-ID": header_id},
                        timeout=30)
    assert bad.status_code == 400 and bad.headers["X-Request-ID"] == header_id
    line = completion(cluster, 0, header_id)
    assert line["status"] == 400
    plain = requests.post(f"{cluster.url(0)}/query", json={"request_id": body_id, "query": "Refunds?"},
                          timeout=120)
    assert plain.status_code == 200 and plain.headers["X-Request-ID"] == body_id


def test_every_log_line_is_json_with_the_common_fields(cluster):
    for node in (0, 1, 2):
        lines = log_lines(cluster, node)
        assert lines and all({"time", "node", "level", "logger", "message"} <= set(e) for e in lines)
        assert {e["node"] for e in lines} == {node}
        assert not [e for e in lines if "rejoins the rotation" in e["message"] and e["level"] != "INFO"]


def test_new_metric_families_appear(cluster):
    from prometheus_client.parser import text_string_to_metric_families
    request_id = uid("metrics-obs")
    assert ask(cluster, request_id, request_id, "Where is my parcel?").status_code == 200
    scraped = {n: list(text_string_to_metric_families(requests.get(f"{cluster.url(n)}/metrics", timeout=10).text))
               for n in (0, 1, 2)}
    families = {n: {f.name for f in found} for n, found in scraped.items()}
    budget = Settings.from_env(cluster.env).generate.kv_cache_tokens
    for node in (0, 1):
        assert {"rag_batch_queue_wait_seconds", "rag_generate_tpot_seconds", "rag_node_info"} <= families[node]
        kv = {s.labels["state"]: s.value for f in scraped[node] if f.name == "rag_generate_kv_tokens" for s in f.samples}
        assert kv["capacity"] == budget and 0 <= kv["in_use"] <= budget, kv  # in_use / capacity: the cache's use
    assert {"rag_gateway_routed", "rag_gateway_in_flight", "rag_gateway_rejected", "rag_gateway_joined",
            "rag_gateway_conflicts"} <= families[0]
    assert "rag_node_info" in families[2] and "rag_batch_queue_wait_seconds" in families[2]
