"""Node 0's OpenAI-compatible routes: POST /v1/chat/completions, GET /v1/models and /v1/models/{id}.

A chat completion is one RAG request through the gateway, as /query is, under the same rules.
`max_tokens` is clamped to OPENAI_MAX_TOKENS_CAP (absent: the contract's 128); the decoding fields
become the request's own, and a sampled answer's seed comes back in a `seed` extension field.
Every error is in OpenAI's shape; once a stream has started, an error is its last data event.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Flask, jsonify

from pipeline import spec
from services.roles.gateway import openai_api as oa
from services.roles.gateway.front import Front
from services.roles.gateway.openai_embeddings import EMBEDDING_MODEL
from services.server import sse
from services.server.answer_request import AnswerRequest
from services.server.openai_errors import error_body
from services.server.stream_response import AnswerStream, close, collect, error_status, sse_response, started

MODEL_ID = spec.GENERATOR_MODEL
SERVED_MODELS = (MODEL_ID, EMBEDDING_MODEL)
# The models' `created` in /v1/models: when this process started serving them.
STARTED_AT = int(time.time())
# The /v1 body's decoding fields, read by the service's own rules (services/server/answer_request.py).
SAMPLING_FIELDS = ("top_p", "top_k", "seed", "stop")


def register_openai_routes(app: Flask, front: Front, default_temperature: float, max_tokens_cap: int) -> None:
    @app.get("/v1/models")
    def models():
        return jsonify({"object": "list", "data": [_model_object(m) for m in SERVED_MODELS]})

    @app.get("/v1/models/<path:model_id>")
    def model(model_id: str):
        if model_id not in SERVED_MODELS:
            raise oa.OpenAIError(404, f"The model `{model_id}` does not exist", "model", code="model_not_found")
        return jsonify(_model_object(model_id))

    @app.post("/v1/chat/completions")
    def chat_completions():
        # Its errors are the app's, in OpenAI's shape (services.roles.gateway.public_api).
        chat, request, events = _start(front, default_temperature, max_tokens_cap)
        if chat.stream:
            return sse_response(started(events),
                                encode=lambda events: _chunks(events, request.request_id, chat.include_usage))
        return jsonify(_completion(collect(events), request.request_id))


def _start(front: Front, default_temperature: float,
           max_tokens_cap: int) -> tuple[oa.ChatRequest, AnswerRequest, AnswerStream]:
    """The body read as OpenAI's, made the service's one request, and its answer stream."""
    body = front.body()
    chat = oa.parse_chat_request(body, max_tokens_limit=max_tokens_cap, model_id=MODEL_ID,
                                 default_max_tokens=spec.MAX_NEW_TOKENS)
    temperature = body.get("temperature")
    request = front.request({"request_id": chat.request_id or oa.completion_id(), "query": chat.query,
                             # None: exactly /query's answer
                             "max_new_tokens": chat.max_tokens if chat.max_tokens != spec.MAX_NEW_TOKENS else None,
                             "stream": chat.stream,
                             "temperature": default_temperature if temperature is None else temperature,
                             **{key: body.get(key) for key in SAMPLING_FIELDS}})
    return chat, request, front.answer(request)


def _model_object(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": STARTED_AT, "owned_by": "rag-service"}


def _completion(reply: dict, request_id: str) -> dict:
    return {**oa.completion(_completion_id(request_id), int(time.time()), MODEL_ID, reply["generated_response"],
                            *oa.usage_counts(reply), reply, finish_reason=reply.get("finish_reason", "stop")),
            **oa.seed_field(reply)}


def _chunks(events: AnswerStream, request_id: str, include_usage: bool) -> Iterator[bytes]:
    """The answer stream as chat.completion.chunk events, then [DONE]; an error as the last event."""
    try:
        for obj in oa.stream_chunks(_completion_id(request_id), int(time.time()), MODEL_ID, events,
                                    include_usage=include_usage):
            yield sse.event(obj)
        yield sse.event(oa.DONE)
    except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
        yield sse.event(error_body(*error_status(exc)))
    finally:
        close(events)


def _completion_id(request_id: str) -> str:
    return request_id if request_id.startswith("chatcmpl-") else f"chatcmpl-{request_id}"
