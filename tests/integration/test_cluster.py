"""The three-node service as real processes on 127.0.0.1 (the shared cluster), checked against the reference."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from pipeline import spec
from tests.helpers import health, post_query, uid, wait_until
from tests.support.second_gateway import second_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(shared_cluster):
    # The shared cluster: its rerank waits long enough that a burst shares batches; float32 so answers
    # match the oracle. Counters are read as deltas: other modules' tests use it too.
    return shared_cluster


def check_reply(reply: dict, request_id: str) -> None:
    assert spec.validate_reply(reply, request_id) == []
    assert reply["generated_response"]  # the contract allows "", a 128-token stand-in answer never is


def test_health_reports_role_source_and_device(cluster):
    h0, h1, h2 = (health(cluster, n) for n in (0, 1, 2))
    assert (h0["status"], h0["node"], h0["total_nodes"], h0["role"]) == ("healthy", 0, 3, "gateway+worker")
    assert (h1["status"], h1["node"], h1["role"]) == ("healthy", 1, "worker")
    assert (h2["status"], h2["node"], h2["role"]) == ("healthy", 2, "index")
    assert h0["model_source"] == h1["model_source"] == "standin:tiny"
    assert h1["device"]["generate"] == "cpu/float32"


def test_a_gateway_names_a_worker_that_computes_with_other_numerics(cluster, tmp_path):
    """A node 0 whose LLM runs in another precision than node 1's: its /health names node 1's difference
    (node 1 stays in the rotation: a mixed deployment may be meant), and its log warns of it."""
    from pipeline.cpu_features import cpu_runs_int4, cpu_supports_bf16
    numerics = health(cluster, 1)["numerics"]
    assert numerics["stages"]["generate"] == "cpu/float32" and numerics["models"] == "standin:tiny"
    assert set(numerics) >= {"torch", "stages", "onednn_isa", "cpu_decode_attention"}
    other = "bfloat16" if cpu_supports_bf16() else "int4-weight" if cpu_runs_int4() else None
    if other is None:
        pytest.skip("this CPU runs the LLM in float32 only")
    with second_gateway(cluster, tmp_path / "logs", GENERATE_PRECISION=other) as gateway:
        def workers():
            return {w["node"]: w for w in health(gateway, 0)["workers"]}
        # compared at node 1's first probe after node 0's own worker joined (at the latest, one health interval on)
        wait_until(lambda: workers()[1]["numerics_differ"], 60, "node 0 never compared node 1's numerics")
        seen = workers()
        assert seen[1]["up"] and seen[0]["numerics_differ"] == {}
        assert seen[1]["numerics_differ"] == {"stages.generate": {"here": f"cpu/{other}", "there": "cpu/float32"}}
        log = gateway.log_path(0).read_text(errors="replace")
        assert "worker node 1 computes with other numerics than this node" in log, log[-2000:]


def test_replies_valid_and_equal_to_reference(cluster, reference_answer):
    url = cluster.url(0)
    queries, prefix = list(spec.REFERENCE_QUERIES), uid("eq")
    with ThreadPoolExecutor(len(queries)) as pool:  # concurrent, so batches form
        replies = list(pool.map(lambda iq: post_query(url, f"{prefix}-{iq[0]}", iq[1]), enumerate(queries)))
    for i, (query, response) in enumerate(zip(queries, replies)):
        assert response.status_code == 200, response.text
        reply = response.json()
        check_reply(reply, f"{prefix}-{i}")
        expected = reference_answer(query, f"{prefix}-{i}")
        assert {k: reply[k] for k in expected} == expected, f"query {query!r} differs from the reference"


def test_both_workers_serve_alternately(cluster):
    before = {n: health(cluster, n)["served"] for n in (0, 1)}
    served_by = []
    for i in range(6):
        response = post_query(cluster.url(0), uid(f"rr{i}"), spec.REFERENCE_QUERIES[i % 8])
        assert response.status_code == 200
        served_by.append(response.json()["served_by"])
    assert all(a != b for a, b in zip(served_by, served_by[1:])), served_by
    after = {n: health(cluster, n)["served"] for n in (0, 1)}
    assert after[0] - before[0] == 3 and after[1] - before[1] == 3


def test_burst_of_32_all_answered_and_generate_batches(cluster):
    url, prefix = cluster.url(0), uid("burst")
    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(lambda i: post_query(url, f"{prefix}-{i}", spec.REFERENCE_QUERIES[i % 8]),
                                  range(32)))
    assert [r.status_code for r in responses] == [200] * 32
    for i, r in enumerate(responses):
        check_reply(r.json(), f"{prefix}-{i}")
    max_batches = [health(cluster, n)["stages"]["generate"]["max_batch"] for n in (0, 1)]
    assert max(max_batches) > 1, max_batches


def test_same_request_id_in_flight_is_computed_once(cluster):
    url, request_id = cluster.url(0), uid("dup")
    before = sum(health(cluster, n)["served"] for n in (0, 1))
    barrier = threading.Barrier(8)

    def send(_):
        barrier.wait()
        return post_query(url, request_id, spec.REFERENCE_QUERIES[0])

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(send, range(8)))
    assert all(r.status_code == 200 for r in responses)
    assert len({r.text for r in responses}) == 1
    assert sum(health(cluster, n)["served"] for n in (0, 1)) - before == 1


@pytest.mark.parametrize("body,content_type,status", [
    (b"{not json", "application/json", 400),
    (b'{"query": "hi"}', "application/json", 400),
    (b'{"request_id": "", "query": "hi"}', "application/json", 400),
    (b'{"request_id": "x", "query": 5}', "application/json", 400),
    (b'["request_id", "query"]', "application/json", 400),
    (b'{"request_id": "x", "query": "hi"}', "text/plain", 415),
])
def test_malformed_query_gets_json_error(cluster, body, content_type, status):
    response = requests.post(f"{cluster.url(0)}/query", data=body, headers={"Content-Type": content_type},
                             timeout=30)
    assert response.status_code == status
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["error"]


@pytest.mark.parametrize("payload,fragment", [
    ({"embeddings": [[0.1] * 10], "k": 10}, "768"),
    ({"embeddings": [[0.1] * 768], "k": 0}, "'k'"),
    ({"embeddings": [[0.1] * 768], "k": 100000}, "'k'"),
    ({"embeddings": [], "k": 10}, "non-empty"),
    ({"embeddings": [["a"] * 768], "k": 10}, "numbers"),
    ({"k": 10}, "'embeddings'"),
])
def test_malformed_search_gets_400(cluster, payload, fragment):
    response = requests.post(f"{cluster.url(2)}/search", json=payload, timeout=30)
    assert response.status_code == 400
    assert fragment in response.json()["error"]


def test_search_rejects_nan_and_serves_valid(cluster):
    bad = '{"embeddings": [[NaN' + ", 0.1" * 767 + ']], "k": 10}'
    response = requests.post(f"{cluster.url(2)}/search", data=bad, headers={"Content-Type": "application/json"},
                             timeout=30)
    assert response.status_code == 400 and "non-finite" in response.json()["error"]
    good = requests.post(f"{cluster.url(2)}/search", json={"embeddings": [[0.03] * 768] * 3, "k": 10}, timeout=30)
    assert good.status_code == 200
    body = good.json()
    assert len(body["ids"]) == 3 and all(len(row) == 10 for row in body["ids"])


def test_bad_requests_do_not_disturb_requests_in_flight(cluster):
    url, prefix = cluster.url(0), uid("mix")
    with ThreadPoolExecutor(16) as pool:
        good = [pool.submit(post_query, url, f"{prefix}-{i}", spec.REFERENCE_QUERIES[i]) for i in range(8)]
        bad = [pool.submit(requests.post, f"{url}/query", data=b"{oops", timeout=30,
                           headers={"Content-Type": "application/json"}) for _ in range(8)]
        search_bad = [pool.submit(requests.post, f"{cluster.url(2)}/search", json={"embeddings": [[1.0]]},
                                  timeout=30) for _ in range(4)]
        assert all(f.result().status_code == 400 for f in bad + search_bad)
        for i, f in enumerate(good):
            assert f.result().status_code == 200
            check_reply(f.result().json(), f"{prefix}-{i}")


def test_node_1_killed_mid_run_then_rejoins(cluster):
    url = cluster.url(0)
    results: dict[int, requests.Response] = {}

    def send(i):
        results[i] = post_query(url, uid(f"kill{i}"), spec.REFERENCE_QUERIES[i % 8])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for i, t in enumerate(threads):
        t.start()
        if i == 5:
            cluster.kill_node(1)
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == list(range(12))
    assert [results[i].status_code for i in range(12)] == [200] * 12
    assert all(results[i].json()["served_by"] in (0, 1) for i in range(12))
    after_kill = [post_query(url, uid(f"solo{i}"), "Refund?").json()["served_by"] for i in range(3)]
    assert after_kill == [0, 0, 0]

    cluster.start_node(1)
    cluster.wait_healthy(nodes=(1,), timeout_s=240)
    deadline = time.monotonic() + 30
    while not all(w["up"] for w in health(cluster, 0)["workers"]):
        assert time.monotonic() < deadline, "node 1 did not rejoin the rotation"
        time.sleep(0.2)
    served_by = {post_query(url, uid(f"back{i}"), "Shipping?").json()["served_by"] for i in range(4)}
    assert served_by == {0, 1}


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    response = requests.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_metrics_parse_and_move_when_requests_are_served(cluster):
    before = {n: scrape(cluster.url(n)) for n in (0, 1, 2)}
    for i in range(4):
        # distinct queries: a repeated one would be served from the embedding cache
        query = f"{spec.REFERENCE_QUERIES[i]} ({uid('q')})"
        assert post_query(cluster.url(0), uid(f"metrics{i}"), query).status_code == 200
    after = {n: scrape(cluster.url(n)) for n in (0, 1, 2)}
    for node in (0, 1):
        for stage in ("embed", "search", "fetch", "rerank", "generate", "sentiment", "toxicity"):
            key = ("rag_batch_items_total", (("stage", stage),))
            assert after[node][key] - before[node].get(key, 0) == 2, (node, stage)
        assert after[node][("rag_batch_size_count", (("stage", "generate"),))] >= 2
        assert after[node][("process_resident_memory_bytes", ())] > 0
        assert after[node][("rag_process_peak_rss_bytes", ())] >= after[node][("process_resident_memory_bytes", ())]
    query_ok = ("rag_http_requests_total", (("endpoint", "/query"), ("status", "200")))
    assert after[0][query_ok] - before[0].get(query_ok, 0) == 4
    assert after[2][("rag_batch_items_total", (("stage", "index"),))] > before[2].get(
        ("rag_batch_items_total", (("stage", "index"),)), 0)
    assert after[0][("rag_http_request_duration_seconds_count", (("endpoint", "/query"),))] >= 4


def test_latency_breakdown_tool_against_the_cluster(cluster, tmp_path):
    import json

    from profiling import latency_breakdown
    metrics = ",".join(f"{n}={cluster.url(n)}/metrics" for n in (0, 1, 2))
    assert latency_breakdown.main(["--url", cluster.url(0), "--metrics", metrics, "--requests", "2",
                                   "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "latency_breakdown.json").read_text())
    assert result["url"] == cluster.url(0) and result["provenance"]["tool"]["commit"]
    rows = result["rows"]
    assert len(rows) == 2
    for row in rows:
        assert row["served_by"] in (0, 1)
        assert all(row["stages_s"][s] > 0 for s in ("embed", "search", "rerank", "generate", "sentiment"))
        assert row["latency_s"] >= row["critical_path_s"] > 0  # stages are inside the request's time
        # generate's split, from the serving worker's counters: one first token, then the answer's decode steps
        split = row["generate"]
        assert 0 < split["first_token_s"] <= row["stages_s"]["generate"]
        # alone, the engine steps for this request only: its first token comes from the prefill
        assert 1 <= split["decode_steps"] <= spec.MAX_NEW_TOKENS - 1 and split["step_ms"] > 0


def test_embedding_cache_skips_the_embedder_and_clears(cluster):
    query = f"Cache me {uid('q')}?"
    before = {n: scrape(cluster.url(n)) for n in (0, 1)}
    for i in range(4):  # round robin: each worker sees the query twice
        assert post_query(cluster.url(0), uid(f"cache{i}"), query).status_code == 200
    after = {n: scrape(cluster.url(n)) for n in (0, 1)}
    for n in (0, 1):
        embedded = after[n][("rag_batch_items_total", (("stage", "embed"),))] - \
            before[n][("rag_batch_items_total", (("stage", "embed"),))]
        hits = after[n][("rag_cache_hits_total", (("cache", "embedding"),))] - \
            before[n].get(("rag_cache_hits_total", (("cache", "embedding"),)), 0)
        assert (embedded, hits) == (1, 1), n
    cleared = requests.post(f"{cluster.url(1)}/cache/clear", timeout=10)
    assert cleared.status_code == 200 and cleared.json()["cleared"]["embedding"] >= 1
    assert requests.post(f"{cluster.url(2)}/cache/clear", timeout=10).json() == {"cleared": {}}
    assert scrape(cluster.url(1))[("rag_cache_entries", (("cache", "embedding"),))] == 0
