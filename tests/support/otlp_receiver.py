"""An OTLP/HTTP traces endpoint on 127.0.0.1 for the tests: keeps each export request it is sent
and decodes the spans (opentelemetry-proto, which the tracing extra installs)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpReceiver:
    """`with OtlpReceiver() as receiver:` serving at receiver.url (http://127.0.0.1:PORT, the base
    URL an OTEL_EXPORTER_OTLP_ENDPOINT names)."""

    def __init__(self):
        exports: list[tuple[str, str, bytes]] = []
        self.exports = exports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                exports.append((self.path, self.headers["Content-Type"], body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> "OtlpReceiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[tuple[dict, object]]:
        """(resource attributes, span) for every span received so far; each export was protobuf to /v1/traces."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        found = []
        for path, content_type, body in list(self.exports):
            assert path == "/v1/traces" and content_type == "application/x-protobuf", (path, content_type)
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                resource = {a.key: a.value.string_value or a.value.int_value for a in resource_spans.resource.attributes}
                found += [(resource, span) for scope in resource_spans.scope_spans for span in scope.spans]
        return found
