"""A streamed answer is counted and timed when it ends, with the status it ended with: its error
event's status, 499 when its reader leaves first (services/server/metrics.py, stream_response.py).
The stream's length is a fake clock the stream itself advances; the reader's leaving is a real
socket closed against a real waitress server on 127.0.0.1 (a thread)."""
from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import pytest
from flask import Flask, g
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config import HttpServerConfig
from services.server import completion
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.app import make_app
from services.server.edge import install_completion_log
from services.server.errors import Overloaded
from services.server.http_server import build_http_server
from services.server.metrics import NodeMetrics
from services.server.stream_response import CLIENT_GONE, sse_response
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)


class Clock:
    """time.perf_counter as the test says: the stream moves it forward between its events."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stream_app(events) -> tuple[Flask, NodeMetrics]:
    """A node's app and metrics with one streamed route whose events are `events()`."""
    app = make_app("t")
    metrics = NodeMetrics()
    metrics.instrument(app)
    install_completion_log(app, also=("/stream",))

    @app.post("/stream")
    def stream():
        g.completion = completion.begin()
        return sse_response(events())

    return app, metrics


def samples(metrics: NodeMetrics) -> dict:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("rag_http_")}


def requests_by_status(metrics: NodeMetrics) -> dict[str, float]:
    return {dict(labels)["status"]: value for (name, labels), value in samples(metrics).items()
            if name == "rag_http_requests_total" and dict(labels)["endpoint"] == "/stream"}


def latency(metrics: NodeMetrics) -> tuple[float, float]:
    """The /stream histogram's count and sum."""
    s = samples(metrics)
    key = (("endpoint", "/stream"),)
    return (s.get(("rag_http_request_duration_seconds_count", key), 0.0),
            s.get(("rag_http_request_duration_seconds_sum", key), 0.0))


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "perf_counter", fake)  # the app's start and the metrics' end both read it
    return fake


def test_a_ten_second_stream_records_ten_seconds_once_when_it_ends(clock):
    def events():
        yield AnswerPiece("piece")
        clock.now += 10.0  # the rest of the answer takes ten seconds
        yield AnswerPiece("more")
        yield FinalAnswer("s", "piecemore", "neutral", "false")

    app, metrics = stream_app(events)
    response = app.test_client().post("/stream", buffered=False)
    chunks = response.response
    assert b"event: token" in next(chunks)
    assert latency(metrics) == (0.0, 0.0) and requests_by_status(metrics) == {}  # not at its first event
    rest = b"".join(chunks)
    response.close()
    assert b"event: reply" in rest
    assert latency(metrics) == (1.0, pytest.approx(10.0))
    assert requests_by_status(metrics) == {"200": 1.0}


@pytest.mark.parametrize("error, status", [(Overloaded("full", retry_after_s=1), "503"),
                                           (RuntimeError("a bug"), "500")])
def test_a_stream_ending_in_an_error_event_is_counted_with_its_status(clock, caplog, error, status):
    def events():
        yield AnswerPiece("piece")
        clock.now += 2.0
        raise error

    app, metrics = stream_app(events)
    with caplog.at_level(logging.INFO, logger="services.requests"):
        response = app.test_client().post("/stream")
        body = response.get_data()
        response.close()  # as a WSGI server does after the last byte
    assert b"event: error" in body and f'"status":{status}'.encode() in body
    assert requests_by_status(metrics) == {status: 1.0}
    assert latency(metrics) == (1.0, pytest.approx(2.0))
    (record,) = [r for r in caplog.records if r.name == "services.requests"]
    assert record.fields["status"] == int(status)  # the completion line agrees with the metrics


def test_a_plain_reply_is_still_counted_once_when_its_view_returns(clock):
    app, metrics = stream_app(lambda: iter(()))

    @app.post("/plain")
    def plain():
        clock.now += 0.5
        return {"ok": True}

    assert app.test_client().post("/plain").status_code == 200
    s = samples(metrics)
    assert s[("rag_http_requests_total", (("endpoint", "/plain"), ("status", "200")))] == 1.0
    assert s[("rag_http_request_duration_seconds_sum", (("endpoint", "/plain"),))] == pytest.approx(0.5)


def test_a_reader_that_leaves_mid_stream_is_counted_once_as_499_over_real_http():
    left = threading.Event()  # the test has closed its socket
    ended = threading.Event()  # the stream's generator has been closed

    def events():
        try:
            yield AnswerPiece("piece")
            left.wait(20)
            while True:  # writes until the server finds the reader gone and closes the stream
                yield AnswerPiece("x" * 65536)
        finally:
            ended.set()

    app, metrics = stream_app(events)
    config = HttpServerConfig(threads=2, read_timeout_s=10.0, connection_limit=16, channel_timeout_s=30.0,
                              max_body_bytes=1024, cluster_token="")
    server = build_http_server(app, "127.0.0.1", 0, config)
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    try:
        with socket.create_connection(server.socket.getsockname(), timeout=20) as client:
            client.sendall(b"POST /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
            received = b""
            while b"event: token" not in received:
                chunk = client.recv(65536)
                assert chunk, "the server closed before the first event"
                received += chunk
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a RST
        left.set()
        assert ended.wait(20), "the server never closed the stream"
        # The teardown runs just after the generator's close, on waitress's thread.
        wait_until(lambda: requests_by_status(metrics), 20, "the closed stream was never counted")
        assert requests_by_status(metrics) == {str(CLIENT_GONE): 1.0}
        assert latency(metrics)[0] == 1.0
    finally:
        server.close()
        server.trigger.close()
        server.task_dispatcher.shutdown()
        thread.join(10)
