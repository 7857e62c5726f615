"""The HTTP layer shared by every node: JSON errors, body parsing, waitress.

Every error a node sends is JSON with an `error` field saying what is wrong;
no handler leaks an HTML page or a traceback. Handlers raise; the one error
handler installed here turns what they raise into an answer through
`services.errors.http_answer`.
"""
from __future__ import annotations

import functools
import hmac
import json
import logging
import math
from typing import Any, Callable

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from services.errors import ApiError, HttpAnswer, http_answer

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024
TOKEN_HEADER = "X-Cluster-Token"


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
        raise ApiError(415, f"expected Content-Type application/json, got {request.mimetype or 'none'!r}",
                       field="Content-Type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"request body is {request.content_length} bytes; the limit is {max_bytes}",
                       field="body")
    # Read at most one byte past the limit: a chunked body has no Content-Length to check first.
    raw = _read_at_most(request.stream, max_bytes + 1)
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is over the limit of {max_bytes} bytes", field="body")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", field="body") from None
    except RecursionError:  # "[[[[..." thousands deep: bad input, not our failure
        raise ApiError(400, "malformed JSON: nested too deeply", field="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object, got {type(body).__name__}", field="body")
    return body


def _read_at_most(stream, limit: int) -> bytes:
    """Up to `limit` bytes; loops because a stream may return less than asked before its end."""
    parts, size = [], 0
    while size < limit:
        part = stream.read(limit - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def require_string(body: dict, field: str, max_length: int) -> str:
    """body[field] as a non-empty string of at most max_length characters; unknown fields are ignored."""
    value = body.get(field)
    if value is None:
        raise ApiError(400, f"'{field}' is required", field=field)
    if not isinstance(value, str):
        raise ApiError(400, f"'{field}' must be a string, got {type(value).__name__}", field=field)
    if not value.strip():
        raise ApiError(400, f"'{field}' must not be empty", field=field)
    if len(value) > max_length:
        raise ApiError(400, f"'{field}' is {len(value)} characters; the limit is {max_length}", field=field)
    try:  # JSON can spell lone surrogates ("\ud800"); no tokenizer, log or reply could carry them
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{field}' must be valid Unicode text (it holds a lone surrogate)",
                       field=field) from None
    return value


def require_cluster_token(expected: str) -> None:
    """401 unless the caller sent the cluster's shared token (no check when none is configured)."""
    if not expected:
        return
    sent = request.headers.get(TOKEN_HEADER, "")
    # WSGI headers are latin-1 strings; compare bytes in constant time so timing leaks nothing.
    if not hmac.compare_digest(sent.encode("latin-1", "replace"), expected.encode("ascii")):
        raise ApiError(401, f"missing or wrong {TOKEN_HEADER}: this endpoint is for cluster nodes only",
                       field=TOKEN_HEADER)


def internal_endpoint(token: str) -> Callable:
    """Decorator for node-to-node endpoints: the token is checked before anything else."""
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(*args, **kwargs):
            require_cluster_token(token)
            return view(*args, **kwargs)
        return checked
    return wrap


def _answer_for(exc: Exception) -> HttpAnswer:
    """The table's answer; Flask's own HTTP errors (404, 405) as they are; anything else is a bug."""
    answer = http_answer(exc)
    if answer is not None:
        return answer
    if isinstance(exc, HTTPException):
        return HttpAnswer(exc.code or 500, exc.description or exc.name)
    log.exception("internal error on %s %s", request.method, request.path)
    return HttpAnswer(500, f"internal error: {type(exc).__name__}")


def install_error_handler(app: Flask) -> None:
    """The one place a raised error becomes an HTTP answer, on every node."""
    @app.errorhandler(Exception)
    def _error(exc: Exception):
        answer = _answer_for(exc)
        if answer.log_level is not None:
            request_id = g.get("request_id")  # set once the body named one; repr: it cannot forge log lines
            tag = f" request_id={request_id!r}" if request_id is not None else ""
            log.log(answer.log_level, "%s %s%s -> %d: %s", request.method, request.path, tag, answer.status, exc)
        return error_response(answer.status, answer.message, field=answer.field,
                              retry_after_s=answer.retry_after_s)


def make_app(name: str) -> Flask:
    app = Flask(name)
    app.json.sort_keys = False
    install_error_handler(app)
    return app


def _json_error_channel():
    """A waitress channel whose own refusals are JSON like every other error.

    Waitress answers some requests before the app sees them (a body over
    max_request_body_size, malformed HTTP) with a text/plain page; callers
    parse our errors as JSON, so those get the same {"error": ...} shape.
    """
    from waitress.channel import HTTPChannel
    from waitress.task import ErrorTask

    class JsonErrorTask(ErrorTask):
        def execute(self):
            error = self.request.error
            field = "body" if error.code == 413 else "request"
            body = json.dumps({"error": f"{error.reason}: {error.body}", "field": field}).encode()
            self.status = f"{error.code} {error.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonErrorChannel(HTTPChannel):
        error_task_class = JsonErrorTask

    return JsonErrorChannel


def serve(app: Flask, host: str, port: int, threads: int, *, channel_timeout_s: float,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """A waitress server, returned unstarted so the caller can close it on SIGTERM.

    `channel_timeout_s`: Settings.channel_timeout_s (derived from REQUEST_TIMEOUT_S).
    """
    from waitress.server import BaseWSGIServer, create_server
    # Waitress buffers a body before the app sees it: cap that a little above the app's
    # own limit (413 from the app), so a huge upload is refused before it is spooled.
    server = create_server(app, host=host, port=port, threads=threads, channel_timeout=channel_timeout_s,
                           connection_limit=max(100, threads * 4), clear_untrusted_proxy_headers=True,
                           max_request_body_size=2 * max_body_bytes, ident="rag-node")
    channel = _json_error_channel()
    sockets = server.map if hasattr(server, "map") else server._map  # one listener, or several
    for dispatcher in sockets.values():
        if isinstance(dispatcher, BaseWSGIServer):
            dispatcher.channel_class = channel
    return server
