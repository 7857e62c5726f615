"""How an error is written, by route: the one table of error shapes.

Every error a node answers (raised on a request's way, refused by the server before its body is read,
or ending a stream that had started) is first the errors table's HttpAnswer (services/server/errors.py),
then written in the shape of the route it came by. Two shapes: the service's own
`{"error": message, "field": ...}`, and under /v1 (and on vLLM's /tokenize, /detokenize) OpenAI's
`{"error": {message, type, param, code}}` with the `x-should-retry` header its SDKs read (true on 408, 429 and the 5xx but 501). A route may call
the service's fields by its body's names (`params`: /v1/chat/completions calls the query `messages`).
Both bodies are written by their pydantic models, which /openapi.json describes them by
(services/roles/gateway/openapi.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Response, jsonify
from pydantic import BaseModel

from services.server.errors import HttpAnswer

SHOULD_RETRY_HEADER = "x-should-retry"
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
# Status -> (OpenAI error type, code) for the statuses the service answers.
OPENAI_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}
# Fields that are no parameter of an OpenAI request body: OpenAI's `param` is null for them.
NOT_OPENAI_PARAMS = frozenset({"body", "request", "Content-Type"})


class ServiceError(BaseModel):
    """/query's and the service's other routes' errors."""
    error: str
    field: str | None = None
    reason: str | None = None  # machine-readable, for the node that called


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """Every /v1 error (and /tokenize's, /detokenize's), with an x-should-retry header."""
    error: OpenAIErrorBody


@dataclass(frozen=True)
class ErrorShape:
    """One row: the body an error is written as (given the field as the route calls it), its headers."""
    name: str
    body: Callable[[HttpAnswer, str | None], dict[str, Any]]
    headers: Callable[[int], dict[str, str]]


def _service_body(answer: HttpAnswer, field: str | None) -> dict[str, Any]:
    return ServiceError(error=answer.message, field=field, reason=answer.reason).model_dump(exclude_none=True)


def openai_kind(status: int) -> tuple[str, str | None]:
    return OPENAI_KINDS.get(status, ("invalid_request_error" if status < 500 else "server_error", None))


def _openai_body(answer: HttpAnswer, field: str | None) -> dict[str, Any]:
    kind, code = openai_kind(answer.status)
    param = None if field in NOT_OPENAI_PARAMS else field
    body = OpenAIErrorBody(message=answer.message, type=kind, param=param, code=answer.code or code)
    return OpenAIError(error=body).model_dump()


SERVICE = ErrorShape("service", _service_body, lambda status: {})
OPENAI = ErrorShape("openai", _openai_body,
                    lambda status: {SHOULD_RETRY_HEADER: "true" if status in RETRYABLE else "false"})
# The table: path prefix -> shape, the first that holds the path decides.
# vLLM's /tokenize and /detokenize sit outside /v1 and answer in its OpenAI shape.
SHAPES: tuple[tuple[str, ErrorShape], ...] = (("/v1", OPENAI), ("/tokenize", OPENAI), ("/detokenize", OPENAI),
                                              ("/", SERVICE))


def shape_for(path: str) -> ErrorShape:
    for prefix, shape in SHAPES:
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return shape
    return SERVICE


def retry_after_header(seconds: float) -> str:
    """A Retry-After value: whole seconds, rounded up, at least 1 (never "come back now")."""
    return str(max(1, math.ceil(seconds)))


def error_headers(answer: HttpAnswer, shape: ErrorShape) -> dict[str, str]:
    headers = shape.headers(answer.status)
    if answer.retry_after_s is not None:
        headers["Retry-After"] = retry_after_header(answer.retry_after_s)
    return headers


def error_response(answer: HttpAnswer, path: str, params: Mapping[str, str] | None = None) -> Response:
    """The answer as the route at `path` writes errors; `params`: the route's names for the fields."""
    shape = shape_for(path)
    field = (params or {}).get(answer.field, answer.field) if answer.field is not None else None
    response = jsonify(shape.body(answer, field))
    response.status_code = answer.status
    response.headers.update(error_headers(answer, shape))
    return response
