"""A Flask app whose every error is JSON: handlers raise, and the one error handler installed here
answers through `services.server.errors.http_answer` (never an HTML page or a traceback), in the
shape of the request's route (services/server/error_shapes.py).
"""
from __future__ import annotations

import logging
import time

from flask import Flask, g, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException

from services.server import tracing
from services.server.error_shapes import error_response
from services.server.errors import HttpAnswer, http_answer
from services.server.request_ids import install_request_id

log = logging.getLogger(__name__)
# A view's attribute naming the service's fields as its route's body calls them (the edge sets it).
ERROR_PARAMS = "error_params"


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
        view = app.view_functions.get(request.url_rule.endpoint) if request.url_rule is not None else None
        return error_response(answer, request.path, getattr(view, ERROR_PARAMS, None))


def make_app(name: str) -> Flask:
    app = Flask(name)
    provider = app.json
    if isinstance(provider, DefaultJSONProvider):
        provider.sort_keys = False  # replies keep the contract's field order
    install_error_handler(app)
    tracing.install_server_spans(app)  # first: it must see the requests the hooks after it refuse
    install_request_id(app)

    # For the request's latency and status in the completion line, the metrics and the server span
    # (after install_request_id: a request it refuses is not timed).
    @app.before_request
    def _note_start():
        g.request_started = time.perf_counter()

    @app.after_request
    def _note_status(response):
        g.response_status = response.status_code
        return response

    return app

