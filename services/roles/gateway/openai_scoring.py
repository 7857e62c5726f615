"""POST /v1/rerank (the shape of Cohere's and Jina's rerank APIs, as vLLM serves it) on the reranker,
and /v1/moderations (OpenAI's shape) on the toxicity model, through the edge (services/server/edge.py).

Each request is items of node 0's own worker's stages, batched with the queries' (a rerank request is
one item of the rerank stage; each moderation input one of the toxicity stage), under what every
answering route is under: a slot of GATEWAY_MAX_IN_FLIGHT while it runs, REQUEST_TIMEOUT_S and a
completion line with its stage times. Their work is bounded in the models' own tokens, counted by
their tokenizers before admission: the query and each document together at most the reranker's
window (spec.TRUNCATE_LENGTH tokens), each moderation input at most the toxicity model's; at most
STAGE_MAX_QUEUE documents or inputs. A text over its bound is a 400 naming it, never cut in silence.

/v1/rerank reads `model` (optional: the reranker), `query`, `documents` (strings, or objects with a
`text`), `top_n` and `return_documents` (default true, as vLLM); results are sorted by
`relevance_score` (the model's logit through a sigmoid, as vLLM and TEI score a one-label
cross-encoder), ties in the documents' order. /v1/moderations reads `model` (optional: the toxicity
model) and `input` (a string, strings, or OpenAI's `{"type": "text", "text"}` parts); its
categories are the toxicity model's own six labels, and `flagged` is the rule of the reply's `is_toxic`
(the top label's probability over spec.TOXICITY_THRESHOLD).
"""
from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from flask import Flask

from pipeline import spec
from services.roles.gateway.endpoint_schemas import (
    ModerationResponse,
    ModerationResult,
    RerankDocument,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from services.roles.gateway.front import Front
from services.roles.worker.request_path import Worker
from services.roles.worker.stage_clock import collect_stage_times
from services.server import completion
from services.server.answer import Computed
from services.server.answer_request import Bounds, check_text
from services.server.deadline import Deadline
from services.server.edge import Call
from services.server.errors import ApiError
from services.server.fields import FieldRules

RERANKER_MODEL = spec.RERANKER_MODEL
MODERATION_MODEL = spec.TOXICITY_MODEL
WINDOW = spec.TRUNCATE_LENGTH  # tokens the reranker (a pair) and the toxicity model (a text) read
_USER = {"user": "an end-user id for the caller's own abuse tracking"}
RERANK_FIELDS = FieldRules(read=("model", "query", "documents", "top_n", "return_documents"), ignored=_USER)
MODERATION_FIELDS = FieldRules(read=("model", "input"), ignored=_USER)


def register_openai_scoring(app: Flask, front: Front, worker: Callable[[], Worker], node: int) -> None:
    def rerank(body: dict) -> Call:
        query, documents, top_n, return_documents = parse_rerank_request(body, front.bounds)
        tokens = check_pair_tokens(query, documents, worker().stages.reranker.pair_tokens)

        def answer(deadline: Deadline):
            def computed():
                yield Computed(_noting_stages(lambda: worker().rerank(query, documents, deadline)), node)
            return front.gateway.require().admitted(computed)
        return Call(answer, reply=lambda reply: rerank_response(reply.value, documents, top_n, return_documents,
                                                                sum(tokens)))

    def moderations(body: dict) -> Call:
        texts, fields = parse_moderation_request(body, front.bounds.limits.stage_max_queue)
        count = worker().stages.toxicity.count_tokens
        for text, field in zip(texts, fields):
            check_window(count(text), field, "the toxicity model's window")

        def answer(deadline: Deadline):
            def computed():
                yield Computed(_noting_stages(lambda: worker().moderate(texts, deadline)), node)
            return front.gateway.require().admitted(computed)
        return Call(answer, reply=lambda reply: moderation_response(reply.value))

    front.edge.add(app, "/v1/rerank", rerank)
    front.edge.add(app, "/v1/moderations", moderations)


def _noting_stages(call: Callable[[], Any]) -> Any:
    """The worker's result, its stage times noted for the completion line (a failure's too)."""
    times = collect_stage_times()
    try:
        return call()
    finally:
        completion.note_stages(times)


def _model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", field="model")
    if model is not None and model != served:
        raise ApiError(404, f"The model `{model}` does not exist; this route serves `{served}`", field="model",
                       code="model_not_found")


def _texts(value: object, field: str, max_items: int, what: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"'{field}' must be a non-empty array of {what}", field=field)
    if len(value) > max_items:
        raise ApiError(400, f"'{field}' has {len(value)} items; the limit is {max_items} (STAGE_MAX_QUEUE)",
                       field=field)
    return value


def parse_rerank_request(body: dict, bounds: Bounds) -> tuple[str, list[str], int | None, bool]:
    """The query, the documents' texts, top_n (None: all) and return_documents; else the ApiError
    (400, 404) naming the field and the rule."""
    RERANK_FIELDS.check(body)
    _model(body, RERANKER_MODEL)
    query = body.get("query")
    check_text(query, "query", bounds)
    documents = []
    for i, document in enumerate(_texts(body.get("documents"), "documents", bounds.limits.stage_max_queue,
                                        "strings or {\"text\": string} objects")):
        if isinstance(document, dict) and set(document) == {"text"}:
            document = document["text"]
        if not isinstance(document, str):
            raise ApiError(400, f"'documents[{i}]' must be a string or an object {{\"text\": string}}",
                           field=f"documents[{i}]")
        documents.append(document)
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise ApiError(400, "'top_n' must be an integer of at least 1", field="top_n")
    return_documents = body.get("return_documents", True)
    if type(return_documents) is not bool:
        raise ApiError(400, "'return_documents' must be true or false", field="return_documents")
    return str(query), documents, top_n, return_documents


def check_window(tokens: int, field: str, window: str) -> int:
    if tokens > WINDOW:
        raise ApiError(400, f"'{field}' is {tokens} tokens; the limit is {WINDOW} tokens ({window}, counted by "
                            "its tokenizer)", field=field)
    return tokens


def check_pair_tokens(query: str, documents: Sequence[str], pair_tokens: Callable[[str, Sequence[str]], list[int]]
                      ) -> list[int]:
    """Each (query, document) pair's tokens, each within the reranker's window; else a 400 naming the
    document."""
    counts = pair_tokens(query, documents)
    for i, tokens in enumerate(counts):
        check_window(tokens, f"documents[{i}]", "the reranker's window, the query and the document together")
    return counts


def parse_moderation_request(body: dict, max_inputs: int) -> tuple[list[str], list[str]]:
    """The input texts and the field naming each; else the ApiError (400, 404) naming the field."""
    MODERATION_FIELDS.check(body)
    _model(body, MODERATION_MODEL)
    raw = body.get("input")
    if isinstance(raw, str):
        return [raw], ["input"]
    texts = []
    for i, item in enumerate(_texts(raw, "input", max_inputs, "strings or text parts")):
        if isinstance(item, dict) and item.get("type") == "text" and set(item) == {"type", "text"}:
            item = item["text"]
        elif isinstance(item, dict) and item.get("type") == "image_url":
            raise ApiError(400, f"'input[{i}]' is an image: this service moderates text only", field=f"input[{i}]",
                           code="unsupported_value")
        if not isinstance(item, str):
            raise ApiError(400, f"'input[{i}]' must be a string or a part {{\"type\": \"text\", \"text\": string}}",
                           field=f"input[{i}]")
        texts.append(item)
    return texts, [f"input[{i}]" for i in range(len(texts))]


def relevance(logit: float) -> float:
    """The logistic sigmoid, without overflow at either end."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    e = math.exp(logit)
    return e / (1.0 + e)


def rerank_response(scores: Sequence[float], documents: Sequence[str], top_n: int | None, return_documents: bool,
                    total_tokens: int) -> dict[str, Any]:
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]  # stable: ties in the documents' order
    results = [RerankResult(index=i, relevance_score=relevance(scores[i]),
                            document=RerankDocument(text=documents[i]) if return_documents else None) for i in ranked]
    return RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=RERANKER_MODEL,
                          usage=RerankUsage(total_tokens=total_tokens), results=results).model_dump(exclude_none=True)


def moderation_response(scores: Sequence[dict[str, float]]) -> dict[str, Any]:
    def result(labels: dict[str, float]) -> ModerationResult:
        return ModerationResult(flagged=spec.is_toxic_flag(max(labels.values())) == "true",
                                categories={label: spec.is_toxic_flag(p) == "true" for label, p in labels.items()},
                                category_scores=dict(labels))
    return ModerationResponse(id=f"modr-{uuid.uuid4().hex}", model=MODERATION_MODEL,
                              results=[result(s) for s in scores]).model_dump()
