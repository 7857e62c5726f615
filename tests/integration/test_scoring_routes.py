"""/v1/rerank and /v1/moderations on node 0 of the real three-node cluster on 127.0.0.1 (the shared
one): through node 0's own worker's rerank and toxicity stages (their batch counters move, the
completion line names the stage), the reranker's order equal to the order a /query's sources were
ranked in, moderation scores equal to the model run in this process, and bad input a 400 in OpenAI's
shape naming the field."""
from __future__ import annotations

import pytest
import requests

from pipeline import spec
from pipeline.docstore import DocumentStore
from profiling.lib.prometheus import scrape
from tests.helpers import uid
from tests.integration.test_observability import completion
from tests.integration.test_streaming import stream_query

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def post(cluster, path: str, body: dict, request_id: str = "") -> requests.Response:
    headers = {"X-Request-ID": request_id} if request_id else {}
    return requests.post(f"{cluster.url(0)}{path}", json=body, headers=headers, timeout=120)


def items(cluster, stage: str) -> float:
    return scrape(f"{cluster.url(0)}/metrics").get("rag_batch_items_total", stage=stage) or 0.0


def test_rerank_orders_a_querys_passages_as_its_answer_was_given_them(cluster, support_data):
    query = spec.REFERENCE_QUERIES[2]
    _pieces, reply = stream_query(cluster.url(0), uid("rr"), query)
    with DocumentStore(support_data.db_path) as store:
        documents = store.fetch(reply["sources"])  # best first, as the worker's rerank stage ordered them
    shuffled = list(reversed(documents))
    before, request_id = items(cluster, "rerank"), uid("rerank")
    r = post(cluster, "/v1/rerank", {"model": spec.RERANKER_MODEL, "query": query,
                                     "documents": [d.content for d in shuffled], "top_n": 5}, request_id)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [shuffled[x["index"]].doc_id for x in body["results"]] == [d.doc_id for d in documents[:5]]
    assert all(0 <= x["relevance_score"] <= 1 for x in body["results"]) and body["usage"]["total_tokens"] > 0
    assert body["results"][0]["document"]["text"] == documents[0].content
    assert items(cluster, "rerank") >= before + 1
    line = completion(cluster, 0, request_id)
    assert line["endpoint"] == "/v1/rerank" and line["served_by"] == 0 and set(line["stages_ms"]) == {"rerank"}


def test_moderations_score_each_input_as_the_toxicity_model_does(cluster, toxicity):
    texts = ["Thank you, the refund arrived.", "word " * 300]
    before, request_id = items(cluster, "toxicity"), uid("modr")
    r = post(cluster, "/v1/moderations", {"input": texts}, request_id)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    for result, expected in zip(results, toxicity.label_scores(texts)):
        assert result["category_scores"] == pytest.approx(expected, abs=1e-5)
        assert result["flagged"] == (max(expected.values()) > spec.TOXICITY_THRESHOLD)
    assert len(results) == 2 and items(cluster, "toxicity") >= before + 2
    line = completion(cluster, 0, request_id)
    assert line["endpoint"] == "/v1/moderations" and set(line["stages_ms"]) == {"toxicity"}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/rerank", {"query": "refund", "documents": ["short", "refund " * 600]}, "documents[1]"),
    ("/v1/rerank", {"query": "refund", "documents": "one string"}, "documents"),
    ("/v1/moderations", {"input": ["fine", "word " * 600]}, "input[1]"),
    ("/v1/moderations", {"input": "a", "model": "omni-moderation-latest"}, "model"),
])
def test_bad_input_is_a_4xx_naming_the_field(cluster, path, body, param):
    r = post(cluster, path, body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param and r.headers["x-should-retry"] == "false"
