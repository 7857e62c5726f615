"""The one error table (services.server.errors.http_answer) and the one handler that applies it."""
from __future__ import annotations

import logging

import pytest
from werkzeug.exceptions import NotFound

from services.server.app import make_app
from services.server.errors import (
    NOT_READY_RETRY_AFTER_S,
    PEER_FAILED,
    PEER_UNAVAILABLE,
    ApiError,
    BatchSizeMismatch,
    DeadlineExceeded,
    NodeNotReady,
    NodeUnreachable,
    NoWorkerAvailable,
    Overloaded,
    PeerFailed,
    PeerRejected,
    PeerRejectedToken,
    PeerTimedOut,
    PeerUnavailable,
    RequestTimeout,
    ServiceClosed,
    StageFailed,
    WorkerFailed,
    http_answer,
)

# (error, status, body, Retry-After header or None)
CASES = [
    (ApiError(400, "'query' is required", field="query"), 400, {"error": "'query' is required", "field": "query"},
     None),
    (ApiError(503, "busy", retry_after_s=2.5), 503, {"error": "busy"}, "3"),
    (Overloaded("stage full", retry_after_s=7), 503, {"error": "overloaded: stage full"}, "7"),
    (Overloaded("stage full", retry_after_s=0), 503, {"error": "overloaded: stage full"}, "1"),
    (ServiceClosed("closed"), 503, {"error": "shutting down"}, "5"),
    (NodeNotReady("node 1 is starting"), 503, {"error": "node 1 is starting"}, "5"),
    (NoWorkerAvailable("no worker could serve the request"), 503,
     {"error": "no worker could serve the request"}, "5"),
    (RequestTimeout("request timed out"), 504, {"error": "Request timeout"}, None),
    (DeadlineExceeded("search gave up"), 504, {"error": "Request timeout"}, None),
    (TimeoutError("read timeout"), 504, {"error": "Request timeout"}, None),
    (WorkerFailed(1, "HTTP 500: boom"), 500, {"error": "internal error on worker node 1"}, None),
    (StageFailed("generate", RuntimeError("boom")), 500,
     {"error": "generate stage failed: RuntimeError: boom"}, None),
    # Another node's errors, should one pass untranslated: its address and words stay in the log.
    (NodeUnreachable("worker at http://10.0.0.2:8000 unreachable"), 503, {"error": PEER_UNAVAILABLE}, "5"),
    (PeerUnavailable("node 1 is starting"), 503, {"error": PEER_UNAVAILABLE}, "5"),
    (PeerTimedOut("worker at http://10.0.0.2:8000 did not answer"), 504, {"error": "Request timeout"}, None),
    (PeerFailed(500, "secret"), 500, {"error": PEER_FAILED}, None),
    (PeerRejected(400, "secret"), 500, {"error": PEER_FAILED}, None),  # our request was wrong: our bug
    (PeerRejectedToken("missing or wrong X-Cluster-Token"), 500, {"error": PEER_FAILED}, None),
]


def raising_client(exc: BaseException):
    app = make_app("errors-test")

    @app.get("/boom")
    def boom():
        raise exc

    return app.test_client()


@pytest.mark.parametrize("exc,status,body,retry_after", CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_each_error_has_one_answer(exc, status, body, retry_after):
    answer = http_answer(exc)
    assert answer is not None and answer.status == status
    response = raising_client(exc).get("/boom")
    assert response.status_code == status
    assert response.get_json() == body
    assert response.headers.get("Retry-After") == retry_after


def test_not_ready_retry_after_is_the_named_constant():
    assert http_answer(NodeNotReady("x")).retry_after_s == NOT_READY_RETRY_AFTER_S


def test_failures_are_logged_at_their_level_and_client_mistakes_not(caplog):
    assert http_answer(WorkerFailed(0, "x")).log_level == logging.ERROR
    assert http_answer(RequestTimeout("x")).log_level == logging.WARNING
    assert http_answer(ApiError(400, "x")).log_level is None
    assert http_answer(PeerFailed(500, "x")).log_level == logging.ERROR
    assert http_answer(PeerUnavailable("x")).log_level == logging.WARNING
    with caplog.at_level(logging.ERROR, logger="services.server.app"):
        raising_client(WorkerFailed(1, "secret detail")).get("/boom")
    assert "secret detail" in caplog.text  # the log has the detail; the reply only the public message


def test_unknown_errors_are_500_with_their_type_only_and_a_traceback(caplog):
    assert http_answer(BatchSizeMismatch("2 results for 3 items")) is None  # a bug, not a known answer
    with caplog.at_level(logging.ERROR, logger="services.server.app"):
        response = raising_client(KeyError("internals")).get("/boom")
    assert response.status_code == 500
    assert response.get_json() == {"error": "internal error: KeyError"}
    assert "Traceback" in caplog.text


def test_http_exceptions_keep_their_code():
    response = raising_client(NotFound("no such thing")).get("/boom")
    assert response.status_code == 404 and response.get_json() == {"error": "no such thing"}
    assert raising_client(NotFound()).get("/nowhere").status_code == 404


def test_every_error_defined_here_has_its_row_but_the_bug():
    import services.server.errors as errors
    kinds = [v for v in vars(errors).values()
             if isinstance(v, type) and issubclass(v, BaseException) and v.__module__ == errors.__name__]
    unanswered = {k.__name__ for k in kinds if not any(issubclass(k, kind) for kind, _ in errors._TABLE)}
    assert unanswered == {"BatchSizeMismatch"}  # a bug: the app's generic 500
