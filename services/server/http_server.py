"""Waitress, hardened: refusals decided from the headers before a body is read (cluster token, size),
JSON error pages, a read timeout against slow clients, a connection limit within the open-files limit.
"""
from __future__ import annotations

import functools
import json
import logging
import resource
import time
from dataclasses import dataclass
from http import HTTPStatus

from flask import Flask

from pipeline.config import ConfigError, HttpServerConfig
from services.server.body import body_too_large
from services.server.error_shapes import error_headers, shape_for
from services.server.errors import ApiError, HttpAnswer, http_answer
from services.server.token import INTERNAL_PREFIX, token_matches, token_refused

log = logging.getLogger(__name__)

# Waitress keeps a partial header in memory: our clients send a few hundred bytes, so 16 KiB
# (waitress: 256 KiB) bounds what a thousand slow connections can hold to 16 MiB.
MAX_HEADER_BYTES = 16 * 1024
# File descriptors a node needs beyond its client connections (models, index, node-to-node pools).
SPARE_FDS = 256


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


def _json_error_channel(gate: HeaderGate):
    """A waitress channel whose parser refuses what HeaderGate refuses before the body is read, whose
    own refusals (malformed HTTP, a body too large, HeaderGate's) are JSON like every other error, and
    which notes since when a request is being read (`reading_since`)."""
    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser
    from waitress.task import ErrorTask
    from waitress.utilities import Error

    class Refusal(Error):
        """A waitress request error carrying HeaderGate's refusal, as the errors table answers it."""

        def __init__(self, exc: ApiError):
            self.answer = http_answer(exc)  # an ApiError's row: its own status, message and field
            super().__init__(exc.message)
            self.code = exc.status
            self.reason = HTTPStatus(self.code).phrase

    class GatedParser(HTTPRequestParser):
        def parse_header(self, header_plus):
            super().parse_header(header_plus)
            # waitress's parser is untyped: its content_length is an int set by parse_header.
            content_length: int = getattr(self, "content_length", 0)
            refused = gate.refusal(self.path, self.headers.get("X_CLUSTER_TOKEN", ""), content_length)
            if refused is not None:
                self.error = Refusal(refused)
                # No body to wait for: waitress then answers at once (and closes the connection).
                self.body_rcv, self.content_length, self.chunked = None, 0, False

    class JsonErrorTask(ErrorTask):
        def execute(self):
            error = self.request.error
            answer = getattr(error, "answer", None) or HttpAnswer(
                error.code, f"{error.reason}: {error.body}", "body" if error.code == 413 else "request")
            shape = shape_for(getattr(self.request, "path", None) or "")
            body = json.dumps(shape.body(answer, answer.field)).encode()
            self.response_headers.extend(error_headers(answer, shape).items())
            self.status = f"{error.code} {error.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonErrorChannel(HTTPChannel):
        error_task_class = JsonErrorTask
        parser_class = GatedParser

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
    """Waitress's idle cleanup, plus: close a connection still reading a request after read_timeout_s
    (waitress alone keeps a slowloris connection that trickles a byte now and then). A request being
    computed is never touched."""
    type(server).maintenance(server, now)
    cutoff = now - read_timeout_s
    for channel in list(server.active_channels.values()):
        since = getattr(channel, "reading_since", None)
        if not channel.requests and since is not None and since < cutoff:
            channel.will_close = True


def _listeners(server) -> list:
    """The server's listening dispatchers: one, or one per address."""
    from waitress.server import BaseWSGIServer
    sockets = server.map if hasattr(server, "map") else server._map
    return [dispatcher for dispatcher in sockets.values() if isinstance(dispatcher, BaseWSGIServer)]


def unsent_replies(server) -> int:
    """Connections whose reply is not all written to its socket yet: a request being served or
    waiting to be, or bytes in the connection's output buffers (what an exit now would cut)."""
    return sum(1 for listener in _listeners(server) for channel in list(listener.active_channels.values())
               if channel.requests or channel.total_outbufs_len)


def _ensure_fd_room(connection_limit: int) -> None:
    """Raise the soft open-files limit so the connection limit can be reached; ConfigError if it cannot."""
    needed = connection_limit + SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise ConfigError(f"HTTP_CONNECTION_LIMIT='{connection_limit}' is not valid: expected at most "
                              f"{hard - SPARE_FDS} (the open-files hard limit {hard} less {SPARE_FDS} spare)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def build_http_server(app: Flask, host: str, port: int, config: HttpServerConfig):
    """A waitress server, returned unstarted so the caller can close it on SIGTERM."""
    from waitress.server import create_server
    read_timeout_s, connection_limit, threads = config.read_timeout_s, config.connection_limit, config.threads
    max_body_bytes = config.max_body_bytes
    _ensure_fd_room(connection_limit)
    gate = header_gate(app, config.cluster_token, max_body_bytes)
    # Waitress refuses a declared size over the limit before reading (as does HeaderGate, with our
    # message); this cap is what stops a chunked body, which declares none.
    server = create_server(app, host=host, port=port, threads=threads, channel_timeout=config.channel_timeout_s,
                           connection_limit=connection_limit, clear_untrusted_proxy_headers=True,
                           max_request_body_size=max_body_bytes + 1, max_request_header_size=MAX_HEADER_BYTES,
                           cleanup_interval=max(0.5, read_timeout_s / 4), ident="rag-node",
                           # Send what a response has written at once (waitress waits for 18000 bytes
                           # by default): each event of an answer stream leaves as it is produced.
                           send_bytes=1)
    channel = _json_error_channel(gate)
    for dispatcher in _listeners(server):
        dispatcher.channel_class = channel
        dispatcher.maintenance = functools.partial(_close_slow_readers, dispatcher, read_timeout_s)
    log.info("HTTP: read timeout %.1fs, %d connections at most, idle keep-alive %.0fs", read_timeout_s,
             connection_limit, config.channel_timeout_s)
    return server
