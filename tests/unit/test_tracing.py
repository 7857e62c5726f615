"""services.server.tracing in one process: off installs nothing, the JSONL line format, W3C propagation
between a client span and a server span, batch notes, and OTLP/HTTP to a receiver on 127.0.0.1."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flask import g, jsonify, request

from pipeline.config import REPO_ROOT, ConfigError, Settings
from pipeline.config.sections import ObservabilitySettings
from services.server import stage_spans, tracing
from services.server.app import make_app
from services.server.completion import Completion
from services.stages.batching import BatchingService

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def settings(**env: str) -> ObservabilitySettings:
    """The observability section, as node 1 would read it from `env`."""
    return Settings.from_env({"NODE_NUMBER": "1", **env}).observability


def start(section: ObservabilitySettings) -> bool:
    return tracing.start(section, 1, "worker")


@pytest.fixture
def spans_file(tmp_path):
    """Tracing on (jsonl) for one test; the file it writes."""
    path = tmp_path / "spans.jsonl"
    assert start(settings(TRACING="jsonl", TRACING_FILE=str(path)))
    yield path
    tracing.stop()


def read_spans(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def one(spans: list[dict], name: str) -> dict:
    (span,) = [s for s in spans if s["name"] == name]
    return span


def traced_app(name: str = "t"):
    """An app whose /work view runs two stages the way services.roles.worker.request_path does."""
    app = make_app(name)

    @app.post("/work")
    def work():
        g.trace_id, g.completion = request.headers.get("X-Request-ID"), Completion(served_by=1)
        for stage in ("embed", "search"):
            span = stage_spans.start_stage(stage, g.trace_id)
            if span is not None:
                span.end(0.002)
        return jsonify({"ok": True})
    return app


def test_off_installs_nothing_and_writes_nothing(tmp_path):
    from opentelemetry import trace
    path = tmp_path / "spans.jsonl"
    assert start(settings(TRACING="off", TRACING_FILE=str(path))) is False
    assert not tracing.enabled()
    assert traced_app().test_client().post("/work", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
                                           ).status_code == 200
    assert stage_spans.start_stage("embed") is None
    with tracing.client_span("POST /x", "http://127.0.0.1:1/x") as call:
        assert dict(call.headers) == {}
    item = object()
    assert stage_spans.noted(None, item) is item
    assert not path.exists() and not list(tmp_path.iterdir())
    # No SDK provider was made global either (the API's default proxy is still there).
    assert "sdk" not in type(trace.get_tracer_provider()).__module__


@pytest.mark.slow  # a fresh interpreter: this one has imported OpenTelemetry already
def test_off_never_imports_opentelemetry():
    # Zero cost when off: a node's modules, its startup and a request through the hooks and the
    # stage helpers leave OpenTelemetry unimported (so a node without the packages runs).
    code = """
import sys
from pipeline.config import Settings
from services.server import stage_spans, tracing
import services.node, services.roles.worker.request_path, services.roles.index.search, services.stages.continuous, services.cluster.clients
from services.server.app import make_app
from services.stages.batching import BatchingService
settings = Settings.from_env({"NODE_NUMBER": "1", "TRACING": "off"})
tracing.require(settings.observability)
assert tracing.start(settings.observability, 1, "worker") is False
app = make_app("t")
app.post("/x")(lambda: "ok")
assert app.test_client().post("/x", headers={"traceparent": "00-%s-%s-01"}).status_code == 200
service = BatchingService("t", stage_spans.noting_batches(lambda items: items), max_size=2, max_wait_ms=1)
assert service.submit(stage_spans.noted(stage_spans.start_stage("embed"), 5)).result(timeout=10) == 5
service.close(timeout=5)
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
""" % (TRACE_ID, PARENT_ID)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("mode", ["jsonl", "otlp"])
def test_tracing_on_without_the_packages_is_one_config_error_naming_the_pip_command(mode, monkeypatch):
    for module in ("opentelemetry", *tracing._NEEDED[mode]):  # an import of any of them now fails
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError) as caught:
        tracing.require(settings(TRACING=mode))
    message = str(caught.value)
    assert message.startswith(f"TRACING={mode} needs the OpenTelemetry packages") and "\n" not in message
    assert tracing.PIP_INSTALL in message and "TRACING=off" in message
    with pytest.raises(ConfigError):
        start(settings(TRACING=mode))
    assert not tracing.enabled()


@pytest.mark.slow  # starts a node process
def test_a_node_with_tracing_on_and_no_opentelemetry_exits_2_with_one_line(tmp_path):
    index = tmp_path / "index.faiss"
    index.write_bytes(b"")  # only its existence is checked before the tracing check
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "NODE_NUMBER": "2", "TRACING": "jsonl",
           "FAISS_INDEX_PATH": str(index), "NODE_2_IP": "127.0.0.1:1"}
    # This Python has the packages: the child hides them the way a missing install would.
    code = "import sys; sys.modules['opentelemetry'] = None; from services.node import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: TRACING=jsonl needs the OpenTelemetry packages") and tracing.PIP_INSTALL in last


def test_a_server_span_continues_the_callers_trace_and_its_stages_are_its_children(spans_file):
    reply = traced_app().test_client().post("/work", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
                                                             "X-Request-ID": "req-7"})
    assert reply.status_code == 200
    spans = read_spans(spans_file)  # SimpleSpanProcessor: written as each span ended, no waiting
    server = one(spans, "POST /work")
    assert server["kind"] == "SERVER" and server["trace_id"] == TRACE_ID and server["parent_span_id"] == PARENT_ID
    assert server["attributes"]["http.response.status_code"] == 200
    assert server["attributes"]["http.route"] == "/work"
    assert server["attributes"][tracing.REQUEST_ID] == "req-7" and server["attributes"]["rag.served_by"] == 1
    assert server["node"] == 1 and server["status"] == "UNSET"
    assert set(server) >= {"name", "trace_id", "span_id", "parent_span_id", "kind", "start_time_ns", "end_time_ns",
                           "status", "attributes", "node"}
    for stage in ("embed", "search"):
        span = one(spans, stage)
        assert span["trace_id"] == TRACE_ID and span["parent_span_id"] == server["span_id"]
        assert span["kind"] == "INTERNAL" and span["attributes"][tracing.REQUEST_ID] == "req-7"
        # ended with the duration the caller measured, from when it started
        assert span["end_time_ns"] - span["start_time_ns"] == 2_000_000


def test_without_a_traceparent_a_request_starts_a_trace_and_errors_mark_the_span(spans_file):
    app = make_app("t")

    @app.post("/fail")
    def fail():
        raise RuntimeError("boom")

    @app.get("/health")
    def health():
        return jsonify({"status": "healthy"})

    assert app.test_client().post("/fail").status_code == 500
    assert app.test_client().get("/health").status_code == 200  # probed every interval: untraced
    (span,) = read_spans(spans_file)
    assert span["name"] == "POST /fail" and span["parent_span_id"] is None
    assert span["status"] == "ERROR" and span["attributes"]["http.response.status_code"] == 500


def test_a_client_spans_headers_make_the_next_nodes_server_span_its_child(spans_file):
    inner = traced_app("inner").test_client()
    outer = make_app("outer")

    @outer.post("/outer")
    def call_inner():
        with tracing.client_span("POST /work", "http://127.0.0.1/work") as call:
            headers = dict(call.headers)
            call.answered(inner.post("/work", headers=headers).status_code)
        return jsonify(headers)

    sent = outer.test_client().post("/outer").get_json()
    spans = read_spans(spans_file)
    outer_server = one(spans, "POST /outer")
    (client,) = [s for s in spans if s["kind"] == "CLIENT"]
    assert client["kind"] == "CLIENT" and client["parent_span_id"] == outer_server["span_id"]
    # version-trace-span-flags; the flags say sampled (and, from newer SDKs, a random trace id)
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", client["trace_id"], client["span_id"]) and int(flags, 16) & 1
    (inner_server,) = [s for s in spans if s["kind"] == "SERVER" and s["name"] == "POST /work"]
    assert inner_server["parent_span_id"] == client["span_id"]
    assert inner_server["trace_id"] == client["trace_id"] == outer_server["trace_id"]
    assert client["attributes"]["http.response.status_code"] == 200


def test_a_batched_call_joins_its_first_requests_trace_and_links_the_others(spans_file):
    first, second = stage_spans.start_stage("search", "a"), stage_spans.start_stage("search", "b")
    with tracing.client_span("POST /search", "http://127.0.0.1/search", [first.context, second.context]):
        pass
    first.end(0.001)
    second.end(0.001)
    spans = read_spans(spans_file)
    client = one(spans, "POST /search")
    a, b = [s for s in spans if s["name"] == "search"]
    assert a["trace_id"] != b["trace_id"]  # two requests, two traces
    assert client["trace_id"] == a["trace_id"] and client["parent_span_id"] == a["span_id"]
    assert client["links"] == [{"trace_id": b["trace_id"], "span_id": b["span_id"]}]


def test_a_failed_call_is_an_error_span(spans_file):
    with pytest.raises(ConnectionError):
        with tracing.client_span("POST /x", "http://127.0.0.1:1/x"):
            raise ConnectionError("refused")
    (span,) = read_spans(spans_file)
    assert span["status"] == "ERROR" and span["kind"] == "CLIENT"


def test_a_stage_span_learns_the_batch_it_ran_in(spans_file):
    service = BatchingService("t", stage_spans.noting_batches(lambda items: [x * 2 for x in items]), max_size=3,
                              max_wait_ms=60_000)
    try:
        span = stage_spans.start_stage("rerank", "r-1")
        # Three items fill the batch at once: no waiting on the window.
        futures = service.submit_many([stage_spans.noted(span, 1), 2, 3])
        assert [f.result(timeout=10) for f in futures] == [2, 4, 6]  # batch_fn saw the items as they were
        span.end(0.001)
    finally:
        service.close(timeout=5)
    (record,) = read_spans(spans_file)
    assert record["attributes"]["rag.batch_size"] == 3 and record["attributes"]["rag.queue_wait_ms"] >= 0


def test_a_continuous_stage_tells_the_span_the_running_batch_it_joined(spans_file):
    span = stage_spans.start_stage("generate", "g-1")
    item = object()
    assert stage_spans.admitted(stage_spans.noted(span, item), 5) is item  # the engine gets the request as it was
    assert stage_spans.admitted(item, 5) is item
    span.end(0.001)
    (record,) = read_spans(spans_file)
    assert record["attributes"]["rag.batch_size"] == 5 and record["attributes"]["rag.queue_wait_ms"] >= 0


def test_the_jsonl_file_defaults_to_logs_under_the_repo():
    from pipeline.config import REPO_ROOT
    assert tracing.jsonl_path(settings(TRACING="jsonl"), 1) == REPO_ROOT / "logs" / "traces-node1.jsonl"


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint that keeps what it is sent."""
    received: list[tuple[str, str, bytes]] = []
    arrived = threading.Event()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
        type(self).arrived.set()

    def log_message(self, *args):
        pass


def test_otlp_sends_protobuf_spans_to_the_endpoint():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
        assert start(settings(TRACING="otlp", TRACING_ENDPOINT=endpoint))
        try:
            assert traced_app().test_client().post("/work", headers={"X-Request-ID": "otlp-1"}).status_code == 200
            assert tracing.force_flush(10_000)  # the batch processor sends now instead of on its timer
        finally:
            tracing.stop()
        assert _Receiver.arrived.wait(10)
    finally:
        server.shutdown()
        server.server_close()
    path, content_type, body = _Receiver.received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    export = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = export.resource_spans
    resource = {a.key: a.value for a in resource_spans.resource.attributes}
    assert resource["service.name"].string_value == "rag-node-1"
    assert resource["rag.node.role"].string_value == "worker"
    names = {s.name for scope in resource_spans.scope_spans for s in scope.spans}
    assert names == {"POST /work", "embed", "search"}


@pytest.mark.parametrize("variable, value, rule", [("OTEL_TRACES_SAMPLER", "sometimes", "traceidratio"),
                                                   ("OTEL_TRACES_SAMPLER_ARG", "1.5", "from 0 to 1")])
def test_a_bad_otel_sampler_setting_is_a_config_error_naming_it(variable, value, rule):
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"TRACING": "otlp", variable: value})
    assert variable in str(error.value) and rule in str(error.value)
