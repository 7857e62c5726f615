"""Opt-in OpenTelemetry tracing: TRACING=off (default) | jsonl | otlp.

One trace per request across the nodes, carried by the W3C `traceparent` header: node 0's SERVER
span (POST /query) -> its CLIENT span to node 1 -> node 1's SERVER span -> one span per stage
(services/server/stage_spans.py) -> the search stage's CLIENT span to node 2 -> node 2's SERVER
span -> its `index` stage span. SERVER spans are Flask hooks on every app (`install_server_spans`);
CLIENT spans wrap each node-to-node call (`client_span`), whose headers carry the traceparent.
A batched search call to node 2 is the child of its first request's search span, linked to the others'.

Off: opentelemetry is never imported and every helper returns at once. On, the SDK reads its own
OTEL_* variables (pipeline/config lists and checks them): OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT when
TRACING_ENDPOINT is empty, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over the node's own
resource, OTEL_TRACES_SAMPLER(_ARG) for which traces are kept (default: every one, a caller's
traceparent decision followed).
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from flask import Flask, g, request

from pipeline.config import REPO_ROOT, ConfigError
from pipeline.config.sections import ObservabilitySettings

log = logging.getLogger(__name__)

# Asked every HEALTH_INTERVAL_S by the gateway and by scrapers: a root trace each would bury the requests.
UNTRACED_ROUTES = frozenset({"/health", "/metrics"})
# OTLP: how often the batch processor sends (the SDK's default is 5 s; a trace should show up soon).
OTLP_SCHEDULE_DELAY_MS = 1000
OTLP_TIMEOUT_S = 10.0
REQUEST_ID = "rag.request_id"  # the id followed across nodes (X-Request-ID, or the body's request_id)


@dataclass
class _On:
    """What tracing holds while on: the provider (to flush and shut down) and its tracer."""
    provider: Any
    tracer: Any
    propagator: Any


_state: _On | None = None
_start_lock = threading.Lock()


def enabled() -> bool:
    return _state is not None


# What TRACING=otlp|jsonl imports, checked at startup so a missing package is one clear line.
_NEEDED = {"jsonl": ("opentelemetry.sdk.trace",),
           "otlp": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")}
PIP_INSTALL = "pip install -e '.[tracing]'"


def require(settings: ObservabilitySettings) -> None:
    """ConfigError (one line naming TRACING and the pip command) when TRACING asks for packages
    this Python lacks; nothing is imported when TRACING=off."""
    import importlib
    for module in _NEEDED.get(settings.tracing, ()):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"TRACING={settings.tracing} needs the OpenTelemetry packages ({exc.name or module} "
                              f"is missing): run {PIP_INSTALL}, or set TRACING=off") from None


def start(settings: ObservabilitySettings, node: int | None, role: str) -> bool:
    """Install this process's tracer (once; a second call is a no-op); False when TRACING=off."""
    global _state
    if settings.tracing == "off":
        return False
    require(settings)
    with _start_lock:
        if _state is not None:
            return True
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        own = Resource({"service.name": "rag-node" if node is None else f"rag-node-{node}",
                        "service.namespace": "rag", "rag.node": -1 if node is None else node,
                        "rag.node.role": role})
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the SDK reads them, win over the node's own.
        resource = own.merge(OTELResourceDetector().detect())
        # sampler=None: the SDK's OTEL_TRACES_SAMPLER(_ARG), by default parentbased_always_on.
        provider = TracerProvider(resource=resource, sampler=None, shutdown_on_exit=True)
        provider.add_span_processor(_processor(settings, node))
        # W3C trace context explicitly: the global propagator would follow OTEL_PROPAGATORS.
        _state = _On(provider, provider.get_tracer("services"), TraceContextTextMapPropagator())
    target = (settings.tracing_endpoint or "the OTEL_EXPORTER_OTLP_* endpoint") if settings.tracing == "otlp" \
        else jsonl_path(settings, node)
    log.info("tracing on: %s, service %s, sampler %s", target, resource.attributes.get("service.name"),
             provider.sampler.get_description())
    return True


def stop() -> None:
    """Flush and shut the provider down (tests; a node's exit does it through the SDK's atexit)."""
    global _state
    with _start_lock:
        state, _state = _state, None
    if state is not None:
        state.provider.shutdown()


def force_flush(timeout_ms: int = 5000) -> bool:
    return _state.provider.force_flush(timeout_ms) if _state is not None else True


def jsonl_path(settings: ObservabilitySettings, node: int | None) -> Path:
    if settings.tracing_file:
        return Path(settings.tracing_file)
    return REPO_ROOT / "logs" / f"traces-node{'' if node is None else node}.jsonl"


def _processor(settings: ObservabilitySettings, node: int | None):
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    if settings.tracing == "jsonl":
        # Written (and flushed) as each span ends: a reader of the file never waits on a timer.
        exporter: Any = JsonlSpanExporter(jsonl_path(settings, node), node)
        return SimpleSpanProcessor(exporter)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    # endpoint=None: the SDK's own OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT.
    exporter = OTLPSpanExporter(endpoint=settings.tracing_endpoint or None, timeout=OTLP_TIMEOUT_S)
    return BatchSpanProcessor(exporter, schedule_delay_millis=OTLP_SCHEDULE_DELAY_MS)


# ------------------------------------------------------------------ the JSONL exporter

def span_record(span, node: int | None) -> dict[str, Any]:
    """One finished span as one JSON object (ids in W3C hex; times in ns since the epoch)."""
    ctx, parent = span.context, span.parent
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
            "kind": span.kind.name, "start_time_ns": span.start_time, "end_time_ns": span.end_time,
            "duration_ms": round((span.end_time - span.start_time) / 1e6, 3),
            "status": span.status.status_code.name, "status_description": span.status.description,
            "attributes": dict(span.attributes or {}),
            "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                      for link in span.links],
            "node": node}


class JsonlSpanExporter:
    """Appends one JSON span per line to a file (opened once; a lock keeps each line whole). A plain
    class with SpanExporter's three methods, so that importing this module never imports the SDK."""

    def __init__(self, path: Path, node: int | None):
        from opentelemetry.sdk.trace.export import SpanExportResult
        self._ok, self._failed = SpanExportResult.SUCCESS, SpanExportResult.FAILURE
        self.node = node
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans) -> Any:
        lines = "".join(json.dumps(span_record(s, self.node), default=str) + "\n" for s in spans)
        with self._lock:
            if self._file.closed:
                return self._failed
            self._file.write(lines)
            self._file.flush()
        return self._ok

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is flushed already

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


# ------------------------------------------------------------------ SERVER spans

def install_server_spans(app: Flask) -> None:
    """A SERVER span per request (but /health and /metrics), continuing the caller's traceparent.
    Installed before the other hooks, so that the 400 of one that raises (a bad X-Request-ID) is traced."""
    @app.before_request
    def _open_server_span():
        state = _state
        if state is None:
            return
        rule = request.url_rule.rule if request.url_rule is not None else None
        if rule in UNTRACED_ROUTES:
            return
        from opentelemetry import context, trace
        parent = state.propagator.extract(request.headers)  # built from the headers alone, never inherited
        span = state.tracer.start_span(f"{request.method} {rule or 'unmatched'}", context=parent,
                                       kind=trace.SpanKind.SERVER,
                                       attributes={"http.request.method": request.method,
                                                   "url.path": request.path, "http.route": rule or ""})
        g.otel_span = span
        g.otel_token = context.attach(trace.set_span_in_context(span, parent))

    @app.teardown_request
    def _close_server_span(exc):
        span = g.pop("otel_span", None)
        if span is None:
            return
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode
        status = g.get("response_status", 500)
        span.set_attribute("http.response.status_code", status)
        for attribute, value in ((REQUEST_ID, g.get("trace_id")), ("rag.body_request_id", g.get("request_id")),
                                 ("rag.served_by", getattr(g.get("completion"), "served_by", None))):
            if value is not None:
                span.set_attribute(attribute, value)
        if status >= 500 or exc is not None:  # a server span's error is the server's (semconv)
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.end()
        context.detach(g.pop("otel_token"))


# ------------------------------------------------------------------ CLIENT spans

class ClientCall:
    """One node-to-node call in flight: the headers to send along, and its answer's status."""

    def __init__(self, span=None, headers: Mapping[str, str] = MappingProxyType({})):
        self.span = span
        self.headers = headers  # read-only when off: one instance serves every call

    def answered(self, status: int) -> None:
        if self.span is not None:
            self.span.set_attribute("http.response.status_code", status)
            if status >= 400:  # a client span's error is any 4xx or 5xx (semconv)
                from opentelemetry.trace import Status, StatusCode
                self.span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


_OFF_CALL = ClientCall()


@contextmanager
def client_span(name: str, url: str, parents: Sequence[Any] = (), *,
                attributes: Mapping[str, Any] = MappingProxyType({})) -> Iterator[ClientCall]:
    """A CLIENT span around one HTTP call to another node; send `call.headers` with it. `parents`: the
    span contexts of the requests a batched call serves (the first is the parent, the others are
    linked); none: the current context's span."""
    state = _state
    if state is None:
        yield _OFF_CALL
        return
    from opentelemetry import trace
    known = [p for p in parents if p is not None]
    parent = trace.set_span_in_context(trace.NonRecordingSpan(known[0])) if known else None
    links = [trace.Link(p) for p in known[1:]]
    span = state.tracer.start_span(name, context=parent, kind=trace.SpanKind.CLIENT, links=links,
                                   attributes={"url.full": url, **{k: v for k, v in attributes.items()
                                                                   if v is not None}})
    headers: dict[str, str] = {}
    state.propagator.inject(headers, context=trace.set_span_in_context(span))
    with trace.use_span(span, end_on_exit=True):  # an exception is recorded and marks the span ERROR
        yield ClientCall(span, headers)


def active() -> _On | None:
    """What tracing holds while on (its tracer), None while off."""
    return _state
