"""One request followed across nodes: its id (X-Request-ID, else the body's request_id) on every
reply and every node-to-node call (/search: the batch's ids, comma-joined).
"""
from __future__ import annotations

from contextvars import ContextVar
from urllib.parse import quote

from flask import Flask, g, request

from services.server.errors import ApiError

REQUEST_ID_HEADER = "X-Request-ID"
# A /search batch names all its requests; longer headers are cut (see batch_request_ids).
MAX_REQUEST_ID_HEADER_CHARS = 1024
# The id of the request this thread serves, for the node-to-node clients that send it along.
current_request_id: ContextVar[str | None] = ContextVar("current_request_id", default=None)


def header_form(request_id: str) -> str:
    """The id as a header value: as it is when printable ASCII without commas (the batch separator),
    else percent-encoded UTF-8 (a body's request_id may hold any text; a header may not)."""
    if request_id.isascii() and request_id.isprintable() and "," not in request_id:
        return request_id
    return quote(request_id, safe="")


def batch_request_ids(ids: list[str]) -> str:
    """One header for a /search batch: its requests' ids comma-joined, cut to a bounded length."""
    joined, kept = "", 0
    for request_id in ids:
        part = header_form(request_id)
        if len(joined) + len(part) + 1 > MAX_REQUEST_ID_HEADER_CHARS - 16:  # room for the "+N more" tail
            return f"{joined},+{len(ids) - kept} more" if joined else f"+{len(ids)} more"
        joined = f"{joined},{part}" if joined else part
        kept += 1
    return joined


def _sent_request_id() -> str | None:
    sent = request.headers.get(REQUEST_ID_HEADER)
    if sent is None:
        return None
    if not sent or len(sent) > MAX_REQUEST_ID_HEADER_CHARS or not (sent.isascii() and sent.isprintable()):
        raise ApiError(400, f"'{REQUEST_ID_HEADER}' must be 1 to {MAX_REQUEST_ID_HEADER_CHARS} printable ASCII "
                            "characters", field=REQUEST_ID_HEADER)
    return sent


def bind_request_id(body_request_id: str) -> str:
    """The request's id once its body is read: the X-Request-ID header's, else the body's request_id."""
    g.request_id = body_request_id  # for the error handler's log line
    if g.get("trace_id") is None:
        g.trace_id = header_form(body_request_id)
        current_request_id.set(g.trace_id)
    return g.trace_id


def install_request_id(app: Flask) -> None:
    @app.before_request
    def _take():
        current_request_id.set(None)  # this thread's previous request is over (and a bad header names none)
        g.trace_id = _sent_request_id()
        current_request_id.set(g.trace_id)

    @app.after_request
    def _return(response):
        if g.get("trace_id"):
            response.headers[REQUEST_ID_HEADER] = g.trace_id
        return response
