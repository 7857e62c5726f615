"""loadgen --api openai (profiling/lib/load.py): the /v1/chat/completions body each request
sends, with sampling, and how its reply is checked; against a node on 127.0.0.1 that records it."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pipeline import spec
from profiling import loadgen
from profiling.lib import load
from profiling.lib.load import ChatLoad


def test_the_body_names_the_model_the_query_and_a_seed_per_request():
    body = ChatLoad(temperature=0.7, seed_base=100, max_tokens=64).body("lg-1", "Where is my order?", 3, True)
    assert body == {"model": spec.GENERATOR_MODEL, "request_id": "lg-1", "temperature": 0.7, "seed": 103,
                    "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Where is my order?"}]}
    assert set(ChatLoad().body("lg-2", "q", 0, False)) == {"model", "request_id", "messages"}  # the server's defaults


def test_the_command_line_picks_the_api_and_its_fields():
    args = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--concurrency", "2", "--count", "4",
                                        "--api", "openai", "--temperature", "0.7", "--seed-base", "5"])
    assert loadgen.chat_load(args) == ChatLoad(0.7, 5, None)
    plain = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--concurrency", "2", "--count", "4"])
    assert loadgen.chat_load(plain) is None


class RecordingNode:
    """POST /v1/chat/completions on 127.0.0.1: records each body and answers a chat.completion for it."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append({"path": self.path, **body})
                reply = json.dumps({"choices": [{"message": {"content": "Returns take 30 days."}}],
                                    "rag": {"request_id": body["request_id"]}, "seed": body.get("seed")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_sampled_load_request_sends_its_fields_and_checks_the_reply():
    node = RecordingNode()
    try:
        target = load.LoadTarget(node.url, ["q0", "q1"], timeout_s=5, deadline=time.monotonic() + 10,
                                 chat=ChatLoad(temperature=0.7, seed_base=40))
        records = [target.send(target.record("g", i, 0.0)) for i in range(2)]
    finally:
        node.close()
    assert all(r.ok and r.status == 200 for r in records)
    assert [(b["path"], b["messages"][0]["content"], b["seed"], b["temperature"]) for b in node.bodies] == [
        ("/v1/chat/completions", "q0", 40, 0.7), ("/v1/chat/completions", "q1", 41, 0.7)]
