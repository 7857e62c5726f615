"""OpenAI's error shape for every error under /v1/ ({"error": {message, type, param, code}}, same
status and Retry-After), and the `x-should-retry` header the SDKs read: true on 429 and the 5xx only.
"""
from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, request

# Status -> (OpenAI error type, code) for the statuses the service answers.
ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
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
# The service's field names as OpenAI's request calls them.
PARAMS: dict[str, str | None] = {"query": "messages", "body": None, "request": None}
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
SHOULD_RETRY_HEADER = "x-should-retry"


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def error_kind(status: int) -> tuple[str, str | None]:
    return ERROR_KINDS.get(status, ("invalid_request_error" if status < 500 else "server_error", None))


def error_body(status: int, message: str, field: str | None = None) -> dict[str, Any]:
    """The service's error (its status, message and field) as OpenAI's error object."""
    kind, code = error_kind(status)
    return {"error": {"message": message, "type": kind, "param": PARAMS.get(field, field) if field else None, "code": code}}


def should_retry(status: int) -> str:
    return "true" if status in RETRYABLE else "false"


def install_openai_errors(app: Flask) -> None:
    @app.after_request
    def _openai_shape(response: Response) -> Response:
        if not is_openai_path(request.path) or response.status_code < 400:
            return response
        body = response.get_json(silent=True) if response.is_json and not response.is_streamed else None
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            response.set_data(json.dumps(error_body(response.status_code, body["error"], body.get("field"))))
            response.mimetype = "application/json"
        response.headers[SHOULD_RETRY_HEADER] = should_retry(response.status_code)
        return response
