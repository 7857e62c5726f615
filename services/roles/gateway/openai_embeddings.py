"""POST /v1/embeddings with the query embedder, through the edge (services/server/edge.py).

The inputs are items of node 0's own worker's embed stage (batched with the queries'), under what
every answering route is under: a slot of GATEWAY_MAX_IN_FLIGHT while it runs, the checks of a query
on each input (MAX_QUERY_CHARS, then MAX_QUERY_TOKENS: `usage` reports that count), at most
STAGE_MAX_QUEUE inputs, REQUEST_TIMEOUT_S, and a completion line. Vectors are /query's (unit-norm,
the embedder's own dimension), as `float` lists or `base64` of little-endian float32. The model is
EMBEDDER_MODEL as configured, and `dimensions` may only name its dimension (read from the loaded
model). Only text is accepted, not token-id arrays. Fields: `model`, `input`, `encoding_format`,
`dimensions`, and `user` (accepted and ignored); any other is refused, naming it.
"""
from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flask import Flask

from services.roles.gateway.endpoint_schemas import Embedding, EmbeddingList, EmbeddingUsage
from services.roles.gateway.front import Front
from services.server.answer import Computed
from services.server.answer_request import check_text
from services.server.deadline import Deadline
from services.server.edge import Call
from services.server.errors import ApiError
from services.server.fields import FieldRules
from services.server.stream_response import AnswerStream

FIELDS = FieldRules(read=("model", "input", "encoding_format", "dimensions"),
                    ignored={"user": "an end-user id for the caller's own abuse tracking"})
Embed = Callable[[list[str], Deadline], list[np.ndarray]]


@dataclass(frozen=True)
class EmbedderModel:
    """The embedder the route serves: EMBEDDER_MODEL as configured, and its vectors' width (read from
    the loaded model)."""
    model: str
    dimension: Callable[[], int]


def register_openai_embeddings(app: Flask, front: Front, embed: Embed, embedder: EmbedderModel, node: int) -> None:
    def embeddings(body: dict) -> Call:
        texts, encoding = parse_embeddings_request(body, front.bounds.limits.stage_max_queue, embedder)
        fields = ["input"] if isinstance(body.get("input"), str) else [f"input[{i}]" for i in range(len(texts))]
        tokens = sum(check_text(text, field, front.bounds) for text, field in zip(texts, fields))

        def answer(deadline: Deadline) -> AnswerStream:
            def computed() -> AnswerStream:
                yield Computed(embed(texts, deadline), node)
            return front.gateway.require().admitted(computed)

        return Call(answer, reply=lambda reply: embeddings_response(reply.value, encoding, tokens, embedder.model))

    front.edge.add(app, "/v1/embeddings", embeddings)


def parse_embeddings_request(body: dict, max_inputs: int, embedder: EmbedderModel) -> tuple[list[str], str]:
    """The input texts and the encoding ('float' or 'base64'), or the ApiError (400, 404) naming the field."""
    FIELDS.check(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "you must provide a model parameter (a string)", field="model")
    if model != embedder.model:
        raise ApiError(404, f"The model `{model}` does not exist; this service embeds with `{embedder.model}`",
                       field="model", code="model_not_found")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", field="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions != embedder.dimension()):
        raise ApiError(400, f"'dimensions' is not supported: the vectors have {embedder.dimension()} (the embedder's own)",
                       field="dimensions", code="unsupported_value")
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise ApiError(400, "'input' must be a string or a non-empty array of strings", field="input")
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "'input' must be text: token-id arrays are not supported (this service's embedder "
                            "has its own tokenizer); with langchain's OpenAIEmbeddings, pass "
                            "check_embedding_ctx_length=False", field="input", code="unsupported_value")
    if len(texts) > max_inputs:
        raise ApiError(400, f"'input' has {len(texts)} strings; the limit is {max_inputs} (STAGE_MAX_QUEUE)",
                       field="input")
    return texts, encoding


def embeddings_response(vectors: list[np.ndarray], encoding: str, prompt_tokens: int, model: str) -> dict[str, Any]:
    data: list[Embedding] = []
    for i, vector in enumerate(vectors):
        values = np.asarray(vector, dtype="<f4")
        embedding: Any = base64.b64encode(values.tobytes()).decode("ascii") if encoding == "base64" \
            else values.tolist()
        data.append(Embedding(object="embedding", index=i, embedding=embedding))
    return EmbeddingList(object="list", data=data, model=model,
                         usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)).model_dump()
