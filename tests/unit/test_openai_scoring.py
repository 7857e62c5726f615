"""services/roles/gateway/openai_scoring.py: /v1/rerank and /v1/moderations on node 0 over a real
Gateway, their worker calls answered by the tiny stand-in reranker and toxicity model: the shapes,
the bounds in the models' own tokens, errors in OpenAI's shape naming the field, and admission; and
the toxicity stage's mixed batches (pipeline/classifiers.py)."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from pipeline import spec
from pipeline.classifiers import ModerationText
from pipeline.config import Settings
from services.roles.gateway.openai_scoring import (
    moderation_response,
    parse_moderation_request,
    parse_rerank_request,
    relevance,
    rerank_response,
)
from services.server.answer_request import Bounds
from services.server.errors import ApiError
from tests.unit.test_gateway_role import query_app

pytestmark = pytest.mark.timeout(120)

DOCS = ["Refunds are issued within 5 business days.", "Parcels to Canada take ten days.", "Reset your password."]


class ModelWorker:
    """What the routes call on node 0's own worker, computed by the models at once (no stage services)."""

    def __init__(self, reranker, toxicity):
        self.stages = SimpleNamespace(reranker=reranker, toxicity=toxicity)
        self.calls: list[tuple] = []

    def rerank(self, query, documents, deadline):
        self.calls.append(("rerank", query, tuple(documents)))
        return self.stages.reranker.score_pairs([(query, d) for d in documents])

    def moderate(self, texts, deadline):
        self.calls.append(("moderate", tuple(texts)))
        return self.stages.toxicity.classify([ModerationText(t) for t in texts])


@pytest.fixture
def app(reranker, toxicity):
    def make(**env):
        role, client = query_app([], **env)
        worker = ModelWorker(reranker, toxicity)
        role.worker_role.worker.set(worker)
        return role, client, worker
    return make


def error_of(response, status: int, param: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["param"] == param and error["message"], error
    return error


# ---------------------------------------------------------------- /v1/rerank

def test_rerank_answers_every_document_sorted_by_relevance_in_vllms_shape(app, reranker):
    _role, client, worker = app()
    r = client.post("/v1/rerank", json={"model": spec.RERANKER_MODEL, "query": "Where is my refund?",
                                        "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2]]})
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    logits = reranker.score_pairs([("Where is my refund?", d) for d in DOCS])
    assert body["model"] == spec.RERANKER_MODEL and body["id"].startswith("rerank-")
    assert [x["index"] for x in body["results"]] == sorted(range(3), key=lambda i: -logits[i])
    assert [x["relevance_score"] for x in body["results"]] == sorted((relevance(s) for s in logits), reverse=True)
    assert all(x["document"] == {"text": DOCS[x["index"]]} for x in body["results"])
    assert body["usage"]["total_tokens"] == sum(reranker.pair_tokens("Where is my refund?", DOCS))
    assert worker.calls == [("rerank", "Where is my refund?", tuple(DOCS))]


def test_rerank_top_n_and_return_documents(app):
    _role, client, _worker = app()
    body = client.post("/v1/rerank", json={"query": "refund", "documents": DOCS, "top_n": 2,
                                           "return_documents": False}).get_json()
    assert len(body["results"]) == 2 and all(set(x) == {"index", "relevance_score"} for x in body["results"])
    assert body["results"][0]["relevance_score"] >= body["results"][1]["relevance_score"]


def test_a_pair_over_the_rerankers_window_is_a_400_naming_the_document_before_any_work(app, reranker):
    _role, client, worker = app()
    long = "refund " * 600
    error = error_of(client.post("/v1/rerank", json={"query": "refund", "documents": ["short", long]}), 400,
                     "documents[1]")
    tokens = reranker.pair_tokens("refund", [long])[0]
    assert f"is {tokens} tokens; the limit is {spec.TRUNCATE_LENGTH} tokens" in error["message"]
    assert worker.calls == []


@pytest.mark.parametrize("body,status,param", [
    ({"query": "q", "documents": ["a"], "model": "cohere-rerank-v3"}, 404, "model"),
    ({"documents": ["a"]}, 400, "query"),
    ({"query": "q"}, 400, "documents"),
    ({"query": "q", "documents": []}, 400, "documents"),
    ({"query": "q", "documents": ["a"] * 9}, 400, "documents"),
    ({"query": "q", "documents": ["a", {"text": "b", "title": "c"}]}, 400, "documents[1]"),
    ({"query": "q", "documents": ["a", 3]}, 400, "documents[1]"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "return_documents"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["text"]}, 400, "rank_fields"),
])
def test_rerank_request_rules(body, status, param):
    bounds = Bounds(dataclasses.replace(Settings.from_env({}).limits, stage_max_queue=8), len)
    with pytest.raises(ApiError) as info:
        parse_rerank_request(body, bounds)
    assert (info.value.status, info.value.field) == (status, param)


def test_rerank_response_ties_keep_the_documents_order_and_scores_are_a_sigmoid():
    body = rerank_response([0.0, 2.0, 0.0, -800.0], ["a", "b", "c", "d"], None, True, 7)
    assert [x["index"] for x in body["results"]] == [1, 0, 2, 3]
    assert body["results"][0]["relevance_score"] == pytest.approx(1 / (1 + math.exp(-2)))
    assert body["results"][1]["relevance_score"] == 0.5 and body["results"][3]["relevance_score"] == 0.0
    assert relevance(800.0) == 1.0 and body["usage"] == {"total_tokens": 7}


# ---------------------------------------------------------------- /v1/moderations

def test_moderations_score_each_input_with_the_toxicity_models_labels(app, toxicity):
    _role, client, worker = app()
    texts = ["you are wonderful", "I will find you"]
    r = client.post("/v1/moderations", json={"input": [texts[0], {"type": "text", "text": texts[1]}]})
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    expected = toxicity.label_scores(texts)
    assert body["model"] == spec.TOXICITY_MODEL and body["id"].startswith("modr-") and len(body["results"]) == 2
    labels = [toxicity.model.config.id2label[i] for i in range(len(toxicity.model.config.id2label))]
    for result, scores in zip(body["results"], expected):
        assert list(result["category_scores"]) == labels
        assert result["category_scores"] == pytest.approx(scores, abs=1e-6)
        assert result["categories"] == {k: v > spec.TOXICITY_THRESHOLD for k, v in result["category_scores"].items()}
        assert result["flagged"] == any(result["categories"].values())
    assert worker.calls == [("moderate", tuple(texts))]
    one = client.post("/v1/moderations", json={"input": "hello", "model": spec.TOXICITY_MODEL}).get_json()
    assert len(one["results"]) == 1


def test_a_moderation_input_over_the_models_window_is_a_400_naming_it(app, toxicity):
    _role, client, worker = app()
    long = "word " * 600
    error = error_of(client.post("/v1/moderations", json={"input": ["fine", long]}), 400, "input[1]")
    assert f"is {toxicity.count_tokens(long)} tokens; the limit is {spec.TRUNCATE_LENGTH}" in error["message"]
    error_of(client.post("/v1/moderations", json={"input": long}), 400, "input")
    assert worker.calls == []


@pytest.mark.parametrize("body,status,param", [
    ({}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": ["a"] * 9}, 400, "input"),
    ({"input": "a", "model": "omni-moderation-latest"}, 404, "model"),
    ({"input": ["a", {"type": "image_url", "image_url": {"url": "x"}}]}, 400, "input[1]"),
    ({"input": ["a", 1]}, 400, "input[1]"),
    ({"input": "a", "threshold": 0.2}, 400, "threshold"),
])
def test_moderation_request_rules(body, status, param):
    with pytest.raises(ApiError) as info:
        parse_moderation_request(body, 8)
    assert (info.value.status, info.value.field) == (status, param)


def test_moderation_response_flags_by_the_is_toxic_rule():
    body = moderation_response([{"toxic": 0.2, "insult": 0.7}, {"toxic": 0.5, "insult": 0.1}])
    assert [r["flagged"] for r in body["results"]] == [True, False]  # over the threshold, as is_toxic
    assert body["results"][0]["categories"] == {"toxic": False, "insult": True}


# ---------------------------------------------------------------- both

def test_each_takes_a_gateway_slot_and_is_refused_at_capacity(app):
    role, client, worker = app()
    gateway = role.gateway.require()
    held = [gateway.admitted(lambda: iter([{"held": True}])) for _ in range(gateway.ids.max_in_flight)]
    for holding in held:
        next(holding)  # holds a slot until closed
    try:
        for path, body in (("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/v1/moderations", {"input": "a"})):
            r = client.post(path, json=body)
            assert r.status_code == 503 and r.get_json()["error"]["type"] == "server_error", path
            assert r.headers["x-should-retry"] == "true"
    finally:
        for holding in held:
            holding.close()
    assert worker.calls == []
    assert client.post("/v1/moderations", json={"input": "a"}).status_code == 200
    assert gateway.stats()["in_flight"] == 0


def test_the_toxicity_stage_scores_moderation_items_beside_answers_as_it_does_alone(toxicity):
    answers = ["ok", "Answer: " + "the parcel is late. " * 60]
    texts = ["you are wonderful", "word " * 400]  # the second longer than an answer's 512 characters
    mixed = toxicity.classify([answers[0], ModerationText(texts[0]), answers[1], ModerationText(texts[1])])
    assert [mixed[0], mixed[2]] == toxicity.classify(answers)
    assert [mixed[1], mixed[3]] == toxicity.label_scores(texts)  # the answers' forward is apart: the same bits
    # read whole: not the first 512 characters an answer is cut to
    assert toxicity.label_scores([texts[1]]) != toxicity.label_scores([texts[1][:512]])


def test_token_counts_are_the_models_tokenizers_untruncated(reranker, toxicity):
    query, long = "refund", "refund " * 700
    assert reranker.pair_tokens(query, ["a b", long]) == [len(reranker.tokenizer(query, d)["input_ids"])
                                                          for d in ("a b", long)]
    assert toxicity.count_tokens(long) == len(toxicity.tokenizer(long)["input_ids"]) > spec.TRUNCATE_LENGTH
    assert reranker.pair_tokens(query, []) == []
