"""client.py --stream against a real HTTP server on 127.0.0.1 that streams /query's events.

The server can stop mid-stream until the test opens a gate; the test opens it only once the
client has printed the first piece, so a client that waited for the whole answer fails here."""
from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler

import pytest

import client
from services.server import sse
from tests.fake_node import LocalServer

PIECES = ["Answer", ": within", " 30 days", " 😀 日本"]
WAIT_S = 10  # a bound for a broken client, not a pace: every wait below ends on an event


class Gate:
    """A step in a script: the server waits here until the test opens it."""

    def __init__(self):
        self.reached = threading.Event()
        self.open = threading.Event()


class StreamingNode(LocalServer):
    """GET /health, and POST /query answered by a script of SSE bytes and Gates.

    chunked: HTTP/1.1 chunked transfer encoding (as waitress sends a stream); otherwise HTTP/1.0
    with the body ending when the connection closes."""

    def __init__(self, script, *, chunked: bool = True, status: int = 200):
        self.bodies: list[dict] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if chunked else "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                data = json.dumps({"status": "healthy", "node": 0, "total_nodes": 3}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                node.bodies.append(body)
                if status != 200:
                    data = json.dumps({"error": "'query' is required"}).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                for name, value in sse.HEADERS.items():
                    self.send_header(name, value)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for step in script(body):
                    if isinstance(step, Gate):
                        step.reached.set()
                        step.open.wait(WAIT_S)
                    elif chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(step), step))
                    else:
                        self.wfile.write(step)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        super().__init__(Handler)


def reply_for(body: dict) -> dict:
    return {"request_id": body["request_id"], "generated_response": "".join(PIECES), "sentiment": "positive",
            "is_toxic": "false", "served_by": 1}


class Recording(io.StringIO):
    """stdout for the client: what it wrote, and an event set once `text` was written."""

    def __init__(self, text: str):
        super().__init__()
        self.seen = threading.Event()
        self._text = text

    def write(self, s: str) -> int:
        written = super().write(s)
        if self._text in self.getvalue():
            self.seen.set()
        return written


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_pieces_are_printed_as_they_arrive(chunked):
    gate = Gate()

    def script(body):
        yield sse.token_event(PIECES[0])
        yield gate  # nothing more until the client has printed the first piece
        yield sse.comment("keep-alive")
        for piece in PIECES[1:]:
            yield sse.token_event(piece)
        yield sse.reply_event(reply_for(body))

    out = Recording(PIECES[0])
    result: list = []
    with StreamingNode(script, chunked=chunked) as node:
        reader = threading.Thread(target=lambda: result.append(
            client.stream_query(node.url, "r-1", "How do I return it?", 30, out)))
        reader.start()
        printed_early = out.seen.wait(WAIT_S)
        # The server sets `reached` just after writing the first piece: the client can print it first.
        reply_not_sent_yet = gate.reached.wait(WAIT_S) and not gate.open.is_set()
        gate.open.set()
        reader.join(WAIT_S)
    assert printed_early and reply_not_sent_yet, "the first piece was not printed before the rest was sent"
    assert node.bodies == [{"request_id": "r-1", "query": "How do I return it?", "stream": True}]
    status, body, streamed = result[0]
    assert status == 200 and body == reply_for(node.bodies[0])
    assert out.getvalue() == streamed == "".join(PIECES) == body["generated_response"]


def test_an_error_event_ends_the_stream_with_its_status():
    def script(body):
        yield sse.token_event("Answer")
        yield sse.error_event("Request timeout", 504)

    out = io.StringIO()
    with StreamingNode(script) as node:
        assert client.stream_query(node.url, "r-2", "q", 30, out) == (504, {"error": "Request timeout"}, "Answer")
    assert out.getvalue() == "Answer"


def test_a_request_refused_before_streaming_is_a_json_error():
    with StreamingNode(lambda body: [], status=400) as node:
        assert client.stream_query(node.url, "r-3", "q", 30, io.StringIO()) == \
            (400, {"error": "'query' is required"}, "")


def test_a_stream_cut_off_without_a_reply_is_a_failure():
    def script(body):
        yield sse.token_event("Ans")
        yield b"event: reply\ndata: {\"request_id\""  # the connection ends mid-event

    with StreamingNode(script) as node:
        status, body, streamed = client.stream_query(node.url, "r-4", "q", 30, io.StringIO())
    assert status is None and "without a reply" in body["error"] and streamed == "Ans"


def test_main_streams_each_answer_then_its_labels(capsys):
    def script(body):
        for piece in PIECES:
            yield sse.token_event(piece)
        yield sse.reply_event(reply_for(body))

    with StreamingNode(script) as node:
        code = client.main(["--stream", "--url", node.url, "--requests", "2", "--wait-health", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert [b["stream"] for b in node.bodies] == [True, True]
    assert out.count(f"    A: {''.join(PIECES)}\n    sentiment=positive is_toxic=false served_by=1") == 2
    assert "succeeded 2, failed 0" in out


def test_main_reports_an_error_event_as_a_failure(capsys):
    def script(body):
        yield sse.token_event("Ans")
        yield sse.error_event("overloaded: the queue is full", 503)

    with StreamingNode(script) as node:
        code = client.main(["--stream", "--url", node.url, "--requests", "1", "--wait-health", "5"])
    out = capsys.readouterr().out
    assert code == 1
    assert "    A: Ans\n" in out and "FAILED (503): overloaded: the queue is full" in out


def test_main_flags_a_stream_that_differs_from_its_reply(capsys):
    def script(body):
        yield sse.token_event("something else")
        yield sse.reply_event(reply_for(body))

    with StreamingNode(script) as node:
        code = client.main(["--stream", "--url", node.url, "--requests", "1", "--wait-health", "5"])
    assert code == 1
    assert "INVALID REPLY: the streamed pieces differ from generated_response" in capsys.readouterr().out
