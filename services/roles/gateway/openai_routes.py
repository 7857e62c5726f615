"""Node 0's OpenAI-compatible routes: POST /v1/chat/completions and /v1/completions (through the
edge, services/server/edge.py), GET /v1/models and /v1/models/{id}.

A completion, chat or text, is one RAG request through the gateway, as /query is, under the same
rules (services/roles/gateway/openai_api.py says what is read, refused and ignored). `max_tokens` is
clamped to OPENAI_MAX_TOKENS_CAP (absent: the contract's 128); the decoding fields become the
request's own, and a sampled answer's seed comes back in a `seed` extension field. Every error is in
OpenAI's shape; once a stream has started, an error is its last data event.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from flask import Flask, jsonify

from pipeline import spec
from services.roles.gateway import openai_api as oa
from services.roles.gateway import openai_responses as out
from services.roles.gateway.endpoint_schemas import Model, ModelList
from services.roles.gateway.front import Front
from services.roles.gateway.openai_choices import (
    choice_chunks,
    choice_requests,
    collected,
    indexed,
    merged,
    summed_usage,
)
from services.server import sse
from services.server.answer import AnswerStream, Choices, FinalAnswer
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.edge import Call
from services.server.error_shapes import OPENAI
from services.server.errors import ApiError
from services.server.stream_response import close, error_answer

MODEL_ID = spec.GENERATOR_MODEL
# The models' `created` in /v1/models: when this process started serving them.
STARTED_AT = int(time.time())
# How each route's body names the service's fields, in its errors.
CHAT_PARAMS = {"query": "messages", "history": "messages", "instructions": "messages", "tool_round": "messages"}
TEXT_PARAMS = {"query": "prompt"}


def served_models(embedder_model: str) -> tuple[str, ...]:
    """What /v1/models lists: the LLM, the configured embedder (EMBEDDER_MODEL), the reranker, the toxicity model."""
    return MODEL_ID, embedder_model, spec.RERANKER_MODEL, spec.TOXICITY_MODEL


def register_openai_routes(app: Flask, front: Front, default_temperature: float, max_tokens_cap: int,
                           embedder_model: str = spec.EMBEDDER_MODEL) -> None:
    served = served_models(embedder_model)

    @app.get("/v1/models")
    def models():
        return jsonify(ModelList(object="list", data=[_model(m) for m in served]).model_dump())

    @app.get("/v1/models/<path:model_id>")
    def model(model_id: str):
        if model_id not in served:
            raise ApiError(404, f"The model `{model_id}` does not exist", field="model", code="model_not_found")
        return jsonify(_model(model_id).model_dump())

    def request(v1: oa.V1Request, prefix: str) -> AnswerRequest:
        """The /v1 request as the service's one request."""
        return front.request({"request_id": v1.request_id or out.completion_id(prefix), "query": v1.query,
                              # None: exactly /query's answer
                              "max_new_tokens": v1.max_tokens if v1.max_tokens != spec.MAX_NEW_TOKENS else None,
                              "stream": v1.stream, "temperature": default_temperature, **v1.sampling,
                              "history": [*v1.history] or None, "instructions": v1.instructions,
                              "tools": [*v1.tools] or None, "tool_round": [*v1.tool_round] or None,
                              "logprobs": v1.logprobs, "parallel_tool_calls": v1.parallel_tool_calls})

    def choices(v1: oa.V1Request, asked: AnswerRequest) -> Callable[[Deadline], AnswerStream]:
        """The n choices' answers at once on one admission slot (openai_choices.py): merged as they come
        if streamed, else collected."""
        return front.choices(choice_requests(asked, v1.n), merged if v1.stream else collected)

    def call(v1: oa.V1Request, asked: AnswerRequest, shape: Callable[[FinalAnswer], dict],
             chunks: Callable[[], out.ChatChunks | out.TextChunks]) -> Call:
        """The route's Call: one answer, or n choices (each its own chunk writer when streamed)."""
        if v1.n > 1:
            return Call(choices(v1, asked), stream=v1.stream, reply=lambda reply: _several(reply, shape),
                        events=_openai_events(lambda events: choice_chunks(events, [chunks() for _ in range(v1.n)])))
        return Call(front.answer(asked), stream=v1.stream, reply=shape,
                    events=_openai_events(lambda events: out.write_chunks(chunks(), events)))  # type: ignore[arg-type]

    def chat(body: dict) -> Call:
        v1 = oa.parse_chat_request(body, max_tokens_limit=max_tokens_cap, model_id=MODEL_ID,
                                   default_max_tokens=spec.MAX_NEW_TOKENS)
        asked = request(v1, "chatcmpl")
        id, created = _completion_id("chatcmpl", asked.request_id), int(time.time())
        return call(v1, asked, lambda answer: out.completion(id, created, MODEL_ID, answer),
                    lambda: out.ChatChunks(id, created, MODEL_ID, include_usage=v1.include_usage))

    def text(body: dict) -> Call:
        v1 = oa.parse_text_request(body, max_tokens_limit=max_tokens_cap, model_id=MODEL_ID,
                                   default_max_tokens=spec.MAX_NEW_TOKENS)
        asked = request(v1, "cmpl")
        id, created = _completion_id("cmpl", asked.request_id), int(time.time())
        return call(v1, asked, lambda answer: out.text_completion(id, created, MODEL_ID, answer),
                    lambda: out.TextChunks(id, created, MODEL_ID, include_usage=v1.include_usage))

    front.edge.add(app, "/v1/chat/completions", chat, params=CHAT_PARAMS)
    front.edge.add(app, "/v1/completions", text, params=TEXT_PARAMS)


def _model(model_id: str) -> Model:
    return Model(id=model_id, object="model", created=STARTED_AT, owned_by="rag-service")


def _several(reply: Choices, one: Callable[[FinalAnswer], dict]) -> dict:
    """The n choices' answers as one object: each choice with its index, the usage summed (the prompt
    once), the `rag` field and `seed` of choice 0 (choice i's seed is seed + i)."""
    objects = [one(answer) for answer in reply.answers]
    return {**objects[0], "choices": [indexed(obj, i)["choices"][0] for i, obj in enumerate(objects)],
            "usage": out.reply_usage(summed_usage(reply.answers))}


def _openai_events(objects: Callable[[AnswerStream], Iterator[dict]]) -> Callable[[AnswerStream], Iterator[bytes]]:
    """A stream's encoder: the answer stream as `objects` makes it, each an event, then [DONE]; an
    error as the last event, in OpenAI's shape."""
    def encode(events: AnswerStream) -> Iterator[bytes]:
        try:
            for obj in objects(events):
                yield sse.event(obj)
            yield sse.event(out.DONE)
        except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
            yield sse.event(OPENAI.body(error_answer(exc), None))
        finally:
            close(events)
    return encode


def _completion_id(prefix: str, request_id: str) -> str:
    return request_id if request_id.startswith(f"{prefix}-") else f"{prefix}-{request_id}"
