"""Node 0's OpenAI-compatible routes: POST /v1/chat/completions and GET /v1/models.

A chat completion is one RAG request through the gateway, as /query is: the last user message
is the query (services/roles/gateway/openai_api.py reads the body), and the request_id rules
(the body's `request_id`, else a new id per request), admission, the query's token limit and the
deadline apply alike. `max_tokens` is clamped to OPENAI_MAX_TOKENS_CAP (absent: the contract's 128);
temperature, top_p, top_k, seed and stop are read by openai_sampling.py, and a sampled answer's
seed comes back in the response's `seed` extension field.
`stream: true` relays the answer's pieces as chat.completion.chunk events as the LLM produces
them, closed by `data: [DONE]`. Every error is in OpenAI's shape with the status the service
gives it; once a stream has started, an error is its last data event.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flask import Flask, Response, jsonify

from pipeline import spec
from pipeline.sampling_params import GREEDY, Sampling
from services.roles.gateway import openai_api as oa
from services.roles.gateway.openai_embeddings import model_object, served_models
from services.roles.gateway.openai_sampling import parse_sampling
from services.roles.worker.role import check_query_tokens
from services.server import sse
from services.server.app import retry_after_header
from services.server.body import read_json_object
from services.server.errors import http_answer
from services.server.request_ids import bind_request_id
from services.server.stream_response import AnswerStream, error_status, sse_response, started

if TYPE_CHECKING:
    from services.roles.gateway.role import GatewayRole

MODEL_ID = spec.GENERATOR_MODEL
# The model's `created` in /v1/models: when this process started serving it.
STARTED_AT = int(time.time())


def register_openai_routes(app: Flask, role: GatewayRole) -> None:
    @app.get("/v1/models")
    def models():
        return jsonify({"object": "list", "data": [model_object(model_id, STARTED_AT) for model_id in served_models(MODEL_ID)]})

    @app.post("/v1/chat/completions")
    def chat_completions():
        try:
            chat, request_id, events, sampling = _start(role)
            extra = {} if sampling.greedy else {"seed": sampling.seed}  # the seed that gives this answer again
            if chat.stream:
                return sse_response(events, encode=lambda events: _chunks(events, request_id, chat.include_usage,
                                                                          extra))
            return jsonify({**_completion(events, request_id), **extra})
        except oa.OpenAIError as exc:
            return _error_response(exc)
        except Exception as exc:  # the service's own errors, in OpenAI's shape with their status
            answer = http_answer(exc)
            if answer is None:
                raise  # a bug: the app's handler answers 500
            response = _error_response(oa.error_from_http(answer.status, answer.message, answer.field))
            if answer.retry_after_s is not None:
                response.headers["Retry-After"] = retry_after_header(answer.retry_after_s)
            return response


def _start(role: GatewayRole) -> tuple[oa.ChatRequest, str, AnswerStream, Sampling]:
    """The request read and checked, and its answer stream started (errors before its first event raise)."""
    role.lifecycle.require_ready()
    settings = role.settings
    body = read_json_object(settings.limits.max_body_bytes)
    chat = oa.parse_chat_request(body, max_tokens_limit=settings.api.max_tokens_cap, model_id=MODEL_ID,
                                 default_max_tokens=spec.MAX_NEW_TOKENS)
    sampling = parse_sampling(body, settings.api.default_temperature)
    if not sampling.greedy and settings.generate.mode != "continuous":
        raise oa.OpenAIError(400, "'temperature' > 0 is not supported: GENERATE_MODE=static decodes greedily",
                             "temperature", code="unsupported_value")
    if len(chat.query) > settings.limits.max_query_chars:
        raise oa.OpenAIError(400, f"the last user message is over {settings.limits.max_query_chars} characters",
                             "messages")
    check_query_tokens(settings, role.count_query_tokens, chat.query)
    request_id = chat.request_id or oa.completion_id()
    if len(request_id) > settings.limits.max_request_id_chars:
        raise oa.OpenAIError(400, f"'request_id' is over {settings.limits.max_request_id_chars} characters",
                             "request_id")
    bind_request_id(request_id)
    cap = chat.max_tokens if chat.max_tokens != spec.MAX_NEW_TOKENS else None  # None: exactly /query's answer
    stream = role.loaded_gateway().answer_stream(request_id, chat.query, settings.limits.request_timeout_s, cap,
                                                 None if sampling == GREEDY else sampling)
    return chat, request_id, started(stream), sampling


def _completion(events: AnswerStream, request_id: str) -> dict:
    text, reply = "", None
    for event in events:
        if isinstance(event, str):
            text += event
        else:
            reply = event
    if reply is None:
        raise RuntimeError("the answer stream ended without its reply")
    prompt_tokens, completion_tokens = _usage(reply)
    return oa.completion(_completion_id(request_id), int(time.time()), MODEL_ID, text, prompt_tokens,
                         completion_tokens, reply, finish_reason=reply.get("finish_reason", "stop"))


def _chunks(events: AnswerStream, request_id: str, include_usage: bool, extra: dict) -> Iterator[bytes]:
    """The answer stream as chat.completion.chunk events, then [DONE]; an error as the last event."""
    cid, created = _completion_id(request_id), int(time.time())
    try:
        yield sse.event(oa.first_chunk(cid, created, MODEL_ID, include_usage=include_usage))
        for event in events:
            if isinstance(event, str):
                yield sse.event(oa.content_chunk(cid, created, MODEL_ID, event, include_usage=include_usage))
                continue
            yield sse.event({**oa.final_chunk(cid, created, MODEL_ID, event.get("finish_reason", "stop"), event,
                                              include_usage=include_usage), **extra})
            if include_usage:
                yield sse.event(oa.usage_chunk(cid, created, MODEL_ID, *_usage(event)))
        yield sse.event(oa.DONE)
    except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
        status, message = error_status(exc)
        yield sse.event(oa.error_from_http(status, message).body())
    finally:
        events.close()  # type: ignore[attr-defined]


def _usage(reply: dict) -> tuple[int, int]:
    usage = reply.get("usage") or {}
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def _completion_id(request_id: str) -> str:
    return request_id if request_id.startswith("chatcmpl-") else f"chatcmpl-{request_id}"


def _error_response(error: oa.OpenAIError) -> Response:
    response = jsonify(error.body())
    response.status_code = error.status
    return response
