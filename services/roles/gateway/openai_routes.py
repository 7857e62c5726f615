"""Node 0's OpenAI-compatible routes: POST /v1/chat/completions and GET /v1/models.

A chat completion is one RAG request through the gateway, as /query is: the last user message
is the query (services/roles/gateway/openai_api.py reads the body), and the request_id rules
(the body's `request_id`, else a new id per request), admission, the query's token limit and the
deadline apply alike. `max_tokens` caps the answer at most at the service's 128 new tokens.
`stream: true` relays the answer's pieces as chat.completion.chunk events as the LLM produces
them, closed by `data: [DONE]`. Every error is in OpenAI's shape with the status the service
gives it; once a stream has started, an error is its last data event.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Flask, Response, jsonify

from pipeline import spec
from services.roles.gateway import openai_api as oa
from services.roles.gateway.front import Front
from services.server import sse
from services.server.answer_request import AnswerRequest
from services.server.app import retry_after_header
from services.server.errors import http_answer
from services.server.stream_response import AnswerStream, close, collect, error_status, sse_response, started

MODEL_ID = spec.GENERATOR_MODEL
# The model's `created` in /v1/models: when this process started serving it.
STARTED_AT = int(time.time())


def register_openai_routes(app: Flask, front: Front) -> None:
    @app.get("/v1/models")
    def models():
        return jsonify(oa.models_list(MODEL_ID, STARTED_AT))

    @app.post("/v1/chat/completions")
    def chat_completions():
        try:
            chat, request, events = _start(front)
            if chat.stream:
                return sse_response(started(events),
                                    encode=lambda events: _chunks(events, request.request_id, chat.include_usage))
            return jsonify(_completion(collect(events), request.request_id))
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


def _start(front: Front) -> tuple[oa.ChatRequest, AnswerRequest, AnswerStream]:
    """The body read as OpenAI's, made the service's one request (its rules: the query's length and
    tokens, the request_id's), and its answer stream."""
    chat = oa.parse_chat_request(front.body(), max_tokens_limit=spec.MAX_NEW_TOKENS, model_id=MODEL_ID)
    request = front.request({"request_id": chat.request_id or oa.completion_id(), "query": chat.query,
                             # None: exactly /query's answer
                             "max_new_tokens": chat.max_tokens if chat.max_tokens < spec.MAX_NEW_TOKENS else None,
                             "stream": chat.stream})
    return chat, request, front.answer(request)


def _completion(reply: dict, request_id: str) -> dict:
    prompt_tokens, completion_tokens = _usage(reply)
    return oa.completion(_completion_id(request_id), int(time.time()), MODEL_ID, reply["generated_response"],
                         prompt_tokens, completion_tokens, reply, finish_reason=reply.get("finish_reason", "stop"))


def _chunks(events: AnswerStream, request_id: str, include_usage: bool) -> Iterator[bytes]:
    """The answer stream as chat.completion.chunk events, then [DONE]; an error as the last event."""
    cid, created = _completion_id(request_id), int(time.time())
    try:
        yield sse.event(oa.first_chunk(cid, created, MODEL_ID, include_usage=include_usage))
        for event in events:
            if isinstance(event, str):
                yield sse.event(oa.content_chunk(cid, created, MODEL_ID, event, include_usage=include_usage))
                continue
            yield sse.event(oa.final_chunk(cid, created, MODEL_ID, event.get("finish_reason", "stop"), event,
                                           include_usage=include_usage))
            if include_usage:
                yield sse.event(oa.usage_chunk(cid, created, MODEL_ID, *_usage(event)))
        yield sse.event(oa.DONE)
    except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
        status, message = error_status(exc)
        yield sse.event(oa.error_from_http(status, message).body())
    finally:
        close(events)


def _usage(reply: dict) -> tuple[int, int]:
    usage = reply.get("usage") or {}
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def _completion_id(request_id: str) -> str:
    return request_id if request_id.startswith("chatcmpl-") else f"chatcmpl-{request_id}"


def _error_response(error: oa.OpenAIError) -> Response:
    response = jsonify(error.body())
    response.status_code = error.status
    return response
