"""The HTTP layer shared by every node: JSON errors, body parsing, the cluster token, waitress
(and, through services.server.tracing, each request's server span).

Every error a node sends is JSON with an `error` field saying what is wrong;
no handler leaks an HTML page or a traceback. Handlers raise; the one error
handler installed here turns what they raise into an answer through
`services.server.errors.http_answer`.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import logging
import math
import resource
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from services.server import tracing
from services.server.errors import ApiError, HttpAnswer, http_answer
from services.server.request_ids import install_request_id

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024
TOKEN_HEADER = "X-Cluster-Token"
# Paths under this prefix are internal on every node, served or not: without the token a caller
# learns nothing (401), not even which node serves them.
INTERNAL_PREFIX = "/internal/"
# Waitress keeps a partial header in memory: our clients send a few hundred bytes, so 16 KiB
# (waitress: 256 KiB) bounds what a thousand slow connections can hold to 16 MiB.
MAX_HEADER_BYTES = 16 * 1024
# File descriptors a node needs beyond its client connections (models, index, node-to-node pools).
SPARE_FDS = 256


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


def read_json_object(max_bytes: int = DEFAULT_MAX_BODY_BYTES, max_values: int | None = None) -> dict:
    """The request body as a JSON object, or an ApiError (415, 413, 400) saying why not.

    `max_values`: refuse (400, field "body") a body that could hold more JSON values than
    that, before parsing it: json.loads makes a Python object of each (a 28 MiB body of
    "[0]," rows would cost over 700 MB and seconds of CPU).
    """
    if request.mimetype != "application/json":
        raise ApiError(415, f"expected Content-Type application/json, got {request.mimetype or 'none'!r}",
                       field="Content-Type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise body_too_large(request.content_length, max_bytes)
    # Read at most one byte past the limit: a chunked body has no Content-Length to check first.
    raw = _read_at_most(request.stream, max_bytes + 1)
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is over the limit of {max_bytes} bytes", field="body")
    if max_values is not None:
        _check_value_count(raw, max_values)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", field="body") from None
    except RecursionError:  # "[[[[..." thousands deep: bad input, not our failure
        raise ApiError(400, "malformed JSON: nested too deeply", field="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object, got {type(body).__name__}", field="body")
    return body


def _check_value_count(raw: bytes, max_values: int) -> None:
    # Each value is an opened container or follows a comma, plus the root: an upper bound
    # (commas and brackets inside strings count too), in a few C-speed passes.
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if values > max_values:
        raise ApiError(400, f"the body holds up to {values} JSON values; the limit is {max_values}", field="body")


def body_too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"request body is {size} bytes; the limit is {limit}", field="body")


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
    if not token_matches(request.headers.get(TOKEN_HEADER, ""), expected):
        raise token_refused()


def token_matches(sent: str, expected: str) -> bool:
    # Headers are latin-1 strings; compare bytes in constant time so timing leaks nothing.
    return hmac.compare_digest(sent.encode("latin-1", "replace"), expected.encode("ascii"))


def token_refused() -> ApiError:
    return ApiError(401, f"missing or wrong {TOKEN_HEADER}: this endpoint is for cluster nodes only",
                    field=TOKEN_HEADER)


def internal_endpoint(token: str) -> Callable:
    """Decorator for node-to-node endpoints: the token is checked before anything else.

    serve() also checks it as soon as the request's headers are in (HeaderGate), before
    waitress reads the body; this check stays for servers other than ours (tests' clients).
    """
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(*args, **kwargs):
            require_cluster_token(token)
            return view(*args, **kwargs)
        checked.cluster_internal = True
        return checked
    return wrap


def warn_if_exposed(host: str, token: str) -> bool:
    """Log loudly when a node listens beyond loopback with no cluster token; True if it did."""
    if token:
        return False
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        loopback = host == "localhost"
    if not loopback:
        log.warning("SECURITY: listening on %s with no CLUSTER_TOKEN: anyone who can reach this address can "
                    "call the internal endpoints (/search, /internal/answer, /cache/clear); set CLUSTER_TOKEN "
                    "on every node or keep the nodes behind a firewall", host)
    return not loopback


@dataclass(frozen=True)
class HeaderGate:
    """What a node refuses once a request's headers are in, before waitress reads its body."""
    token: str
    internal_paths: frozenset
    max_body_bytes: int

    def refusal(self, path: str, sent_token: str, content_length: int) -> ApiError | None:
        internal = path in self.internal_paths or path.startswith(INTERNAL_PREFIX)
        if internal and self.token and not token_matches(sent_token, self.token):
            return token_refused()
        if content_length > self.max_body_bytes:
            return body_too_large(content_length, self.max_body_bytes)
        return None


def header_gate(app: Flask, token: str, max_body_bytes: int) -> HeaderGate:
    internal = frozenset(rule.rule for rule in app.url_map.iter_rules()
                         if getattr(app.view_functions.get(rule.endpoint), "cluster_internal", False))
    return HeaderGate(token, internal, max_body_bytes)


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
    tracing.install_server_spans(app)  # first: it must see the requests the hooks after it refuse
    install_request_id(app)
    return app


def _refusal_class():
    from waitress.utilities import Error

    class Refusal(Error):
        """A waitress request error carrying our table's answer (HeaderGate's refusals)."""

        def __init__(self, exc: ApiError):
            self.answer = http_answer(exc)
            super().__init__(self.answer.message)
            self.code = self.answer.status
            self.reason = HTTPStatus(self.code).phrase

    return Refusal


def _gated_parser(gate: HeaderGate):
    from waitress.parser import HTTPRequestParser
    refusal_class = _refusal_class()

    class GatedParser(HTTPRequestParser):
        def parse_header(self, header_plus):
            super().parse_header(header_plus)
            refused = gate.refusal(self.path, self.headers.get("X_CLUSTER_TOKEN", ""), self.content_length)
            if refused is not None:
                self.error = refusal_class(refused)
                # No body to wait for: waitress then answers at once (and closes the connection).
                self.body_rcv, self.content_length, self.chunked = None, 0, False

    return GatedParser


def _json_error_channel(gate: HeaderGate):
    """A waitress channel whose own refusals are JSON like every other error.

    Waitress answers some requests before the app sees them (a body over
    max_request_body_size, malformed HTTP, HeaderGate's refusals) with a text/plain
    page; callers parse our errors as JSON, so those get the same {"error": ...} shape.
    It also notes since when a request is being read (`reading_since`), for the read timeout.
    """
    from waitress.channel import HTTPChannel
    from waitress.task import ErrorTask

    class JsonErrorTask(ErrorTask):
        def execute(self):
            error = self.request.error
            answer = getattr(error, "answer", None) or HttpAnswer(
                error.code, f"{error.reason}: {error.body}", "body" if error.code == 413 else "request")
            body = json.dumps({"error": answer.message, "field": answer.field}).encode()
            self.status = f"{error.code} {error.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonErrorChannel(HTTPChannel):
        error_task_class = JsonErrorTask
        parser_class = _gated_parser(gate)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.reading_since = self.creation_time  # a new connection must start its request in time

        def received(self, data):
            if self.request is None and self.reading_since is None:
                self.reading_since = time.time()  # the first bytes of a request on a kept-alive connection
            result = super().received(data)
            if self.request is None:  # no request left half-read
                self.reading_since = None
            return result

    return JsonErrorChannel


def _close_slow_readers(server, read_timeout_s: float, now: float) -> None:
    """Waitress's idle cleanup, plus: close a connection still reading a request after read_timeout_s.

    Waitress itself closes only connections with no bytes for channel_timeout, so a client that
    trickles a header byte now and then (slowloris) would keep its connection for ever. A request
    being computed is never touched (channel.requests holds it).
    """
    type(server).maintenance(server, now)
    cutoff = now - read_timeout_s
    for channel in list(server.active_channels.values()):
        since = getattr(channel, "reading_since", None)
        if not channel.requests and since is not None and since < cutoff:
            channel.will_close = True


def _ensure_fd_room(connection_limit: int) -> None:
    """Raise the soft open-files limit so the connection limit can be reached; ConfigError if it cannot."""
    from pipeline.config import ConfigError
    needed = connection_limit + SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise ConfigError(f"HTTP_CONNECTION_LIMIT='{connection_limit}' is not valid: expected at most "
                              f"{hard - SPARE_FDS} (the open-files hard limit {hard} less {SPARE_FDS} spare)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def serve(app: Flask, host: str, port: int, threads: int, *, settings,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """A waitress server, returned unstarted so the caller can close it on SIGTERM.

    `settings` gives the read timeout, the connection limit, the cluster token and
    `channel_timeout_s` (derived from REQUEST_TIMEOUT_S: how long a kept-alive connection may
    sit idle between requests); it also starts the node's tracing (TRACING, services.server.tracing).
    """
    from waitress.server import BaseWSGIServer, create_server
    # Before the role loads (its worker asks whether tracing is on); TRACING=off installs nothing.
    tracing.start(settings)
    read_timeout_s, connection_limit = settings.read_timeout_s, settings.connection_limit(threads)
    _ensure_fd_room(connection_limit)
    warn_if_exposed(host, settings.cluster_token)
    gate = header_gate(app, settings.cluster_token, max_body_bytes)
    # Waitress refuses a declared size over the limit before reading (as does HeaderGate, with our
    # message); this cap is what stops a chunked body, which declares none.
    server = create_server(app, host=host, port=port, threads=threads, channel_timeout=settings.channel_timeout_s,
                           connection_limit=connection_limit, clear_untrusted_proxy_headers=True,
                           max_request_body_size=max_body_bytes + 1, max_request_header_size=MAX_HEADER_BYTES,
                           cleanup_interval=max(0.5, read_timeout_s / 4), ident="rag-node")
    channel = _json_error_channel(gate)
    sockets = server.map if hasattr(server, "map") else server._map  # one listener, or several
    for dispatcher in sockets.values():
        if isinstance(dispatcher, BaseWSGIServer):
            dispatcher.channel_class = channel
            dispatcher.maintenance = functools.partial(_close_slow_readers, dispatcher, read_timeout_s)
    log.info("HTTP: read timeout %.1fs, %d connections at most, idle keep-alive %.0fs", read_timeout_s,
             connection_limit, settings.channel_timeout_s)
    return server
