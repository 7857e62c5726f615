"""The HTTP layer shared by every node: JSON errors, body parsing, waitress.

Every error a node sends is JSON with an `error` field saying what is wrong;
no handler leaks an HTML page or a traceback.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from services.batching import Overloaded, ServiceClosed

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024


class ApiError(Exception):
    """An error meant for the caller: status code, message, optional extra fields."""

    def __init__(self, status: int, message: str, *, field: str | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


def error_response(status: int, message: str, *, field: str | None = None,
                   retry_after_s: float | None = None) -> Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    response = jsonify(body)
    response.status_code = status
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return response


def read_json_object(max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> dict:
    """The request body as a JSON object, or an ApiError (415, 413, 400) saying why not."""
    if request.mimetype != "application/json":
        raise ApiError(415, f"expected Content-Type application/json, got {request.mimetype or 'none'!r}")
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"request body is {request.content_length} bytes; the limit is {max_bytes}")
    raw = request.get_data(cache=False)
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is over the limit of {max_bytes} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object, got {type(body).__name__}")
    return body


def require_string(body: dict, field: str, max_length: int) -> str:
    value = body.get(field)
    if value is None:
        raise ApiError(400, f"'{field}' is required", field=field)
    if not isinstance(value, str):
        raise ApiError(400, f"'{field}' must be a string, got {type(value).__name__}", field=field)
    if not value.strip():
        raise ApiError(400, f"'{field}' must not be empty", field=field)
    if len(value) > max_length:
        raise ApiError(400, f"'{field}' is {len(value)} characters; the limit is {max_length}", field=field)
    return value


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.message, field=exc.field, retry_after_s=exc.retry_after_s)

    @app.errorhandler(Overloaded)
    def _overloaded(exc: Overloaded):
        return error_response(503, f"overloaded: {exc}", retry_after_s=getattr(exc, "retry_after_s", 1.0) or 1.0)

    @app.errorhandler(ServiceClosed)
    def _closed(exc: ServiceClosed):
        return error_response(503, "shutting down", retry_after_s=5)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        return error_response(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _internal(exc: Exception):
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(500, f"internal error: {type(exc).__name__}")


def make_app(name: str) -> Flask:
    app = Flask(name)
    app.json.sort_keys = False
    install_error_handlers(app)
    return app


def serve(app: Flask, host: str, port: int, threads: int):
    """A waitress server, returned unstarted so the caller can close it on SIGTERM."""
    from waitress.server import create_server
    # channel_timeout above the request timeout: waitress must not cut a long generation.
    return create_server(app, host=host, port=port, threads=threads, channel_timeout=600,
                         connection_limit=max(100, threads * 4), clear_untrusted_proxy_headers=True,
                         ident="rag-node")
