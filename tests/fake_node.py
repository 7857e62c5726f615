"""A stand-in node 0 for the load tools' tests: a real HTTP server on 127.0.0.1 (a thread, an
OS-picked port) answering /health, /query and /metrics as the service does, with no models."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 104857600\n"


class LocalServer:
    """An HTTP server on 127.0.0.1 (an OS-picked port) served from a daemon thread inside a `with` block."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


class FakeNode(LocalServer):
    """health_status: what GET /health answers; bad_reply: /query breaks the contract (no sentiment)."""

    def __init__(self, health_status: int = 200, bad_reply: bool = False):
        self.health_status = health_status
        self.bad_reply = bad_reply
        self.health_calls = 0
        self.metrics_calls = 0  # a decoy cluster's tests check that nothing scraped it
        self.queries: list[str] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: str, kind: str = "application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    node.health_calls += 1
                    self._send(node.health_status, json.dumps({"status": "healthy", "node": 0, "total_nodes": 3}))
                elif self.path == "/metrics":
                    node.metrics_calls += 1
                    self._send(200, METRICS, "text/plain")
                else:
                    self._send(404, "{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                node.queries.append(body["request_id"])
                reply = {"request_id": body["request_id"], "generated_response": "Answer: ok",
                         "sentiment": "neutral", "is_toxic": "false", "served_by": 0}
                if node.bad_reply:
                    del reply["sentiment"]
                self._send(200, json.dumps(reply))

        super().__init__(Handler)
