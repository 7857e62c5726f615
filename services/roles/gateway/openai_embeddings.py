"""POST /v1/embeddings with the query embedder.

The inputs are items of node 0's embed stage (batched with /query's), queued all or none, under
/query's limits: MAX_QUERY_CHARS and MAX_QUERY_TOKENS each (`usage` reports that count), the
stage queue, REQUEST_TIMEOUT_S. Vectors are /query's (unit-norm, 768 floats), as `float` lists or
`base64` of little-endian float32. Only text is accepted, not token-id arrays.
"""
from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from flask import Flask, jsonify

from pipeline import spec
from services.roles.gateway.front import Front
from services.roles.gateway.openai_api import OpenAIError
from services.roles.loaded import Loaded
from services.roles.worker.request_path import Worker
from services.server.answer_request import check_query_tokens
from services.server.errors import ApiError, RequestTimeout
from services.stages.futures import results_by

EMBEDDING_MODEL = spec.EMBEDDER_MODEL


def register_openai_embeddings(app: Flask, front: Front, worker: Loaded[Worker]) -> None:
    @app.post("/v1/embeddings")
    def embeddings():
        limits = front.limits
        texts, encoding = parse_embeddings_request(front.body(), limits.stage_max_queue)
        counts = []
        for i, text in enumerate(texts):
            if len(text) > limits.max_query_chars:
                raise OpenAIError(400, f"input[{i}] is over {limits.max_query_chars} characters", "input")
            try:
                counts.append(check_query_tokens(text, front.bounds, "input"))
            except ApiError as exc:
                raise OpenAIError(400, f"input[{i}]: {exc.message}", "input") from None
        futures = worker.require().services[spec.Stage.EMBED].submit_many(texts)  # type: ignore[attr-defined]
        vectors = results_by(futures, time.monotonic() + limits.request_timeout_s, RequestTimeout("request timed out"))
        return jsonify(embeddings_response(vectors, encoding, sum(counts)))


def parse_embeddings_request(body: dict, max_inputs: int) -> tuple[list[str], str]:
    """The input texts and the encoding ('float' or 'base64'), or the OpenAIError (400, 404) naming the field."""
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "you must provide a model parameter (a string)", "model")
    if model != EMBEDDING_MODEL:
        raise OpenAIError(404, f"The model `{model}` does not exist; this service embeds with `{EMBEDDING_MODEL}`",
                          "model", code="model_not_found")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    if body.get("dimensions") not in (None, spec.EMBED_DIM):
        raise OpenAIError(400, f"'dimensions' is not supported: the vectors have {spec.EMBED_DIM}", "dimensions",
                          code="unsupported_value")
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise OpenAIError(400, "'input' must be a string or a non-empty array of strings", "input")
    if not all(isinstance(t, str) for t in texts):
        raise OpenAIError(400, "'input' must be text: token-id arrays are not supported (this service's embedder "
                               "has its own tokenizer); with langchain's OpenAIEmbeddings, pass "
                               "check_embedding_ctx_length=False", "input", code="unsupported_value")
    if any(not t.strip() for t in texts):
        raise OpenAIError(400, "'input' strings must not be empty", "input")
    if len(texts) > max_inputs:
        raise OpenAIError(400, f"'input' has {len(texts)} strings; the limit is {max_inputs} (STAGE_MAX_QUEUE)",
                          "input")
    return texts, encoding


def embeddings_response(vectors: list[np.ndarray], encoding: str, prompt_tokens: int) -> dict[str, Any]:
    data = []
    for i, vector in enumerate(vectors):
        values = np.asarray(vector, dtype="<f4")
        embedding: Any = base64.b64encode(values.tobytes()).decode("ascii") if encoding == "base64" \
            else values.tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": EMBEDDING_MODEL,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

