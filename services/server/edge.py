"""The one edge every answering route enters by: /query, /v1/chat/completions, /v1/completions and
/v1/embeddings on node 0, /internal/answer on a worker.

`Edge.add(app, path, parse)` serves a route with one view: the node ready, the body read within
MAX_BODY_BYTES, the route's `parse` (its body translated and read by the one parser,
services/server/answer_request.py) giving a `Call`, the request's Deadline made once and passed down,
the answer stream, then the reply collected as JSON or streamed in the route's format. An error is
raised and written by the app's one handler in the route's shape (services/server/error_shapes.py,
the route's `params` naming the fields as its body does); once a stream has started, the route's
encoder writes it as the stream's last event. Every request on an edge route writes one completion
line when it ends (a stream: after its last event): its status, latency, the worker that computed it
(the reply's `served_by`) and its stage times (services/server/completion.py).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, g, jsonify, request

from pipeline.config.sections import LimitsSettings
from services.server import completion
from services.server.answer import AnswerStream, Computed, final_of
from services.server.app import ERROR_PARAMS
from services.server.body import read_json_object
from services.server.deadline import Deadline
from services.server.lifecycle import Lifecycle
from services.server.stream_response import close, collect, query_events, sse_response, started

# One line per request per node, in a logger of its own so it can be routed on its own.
request_log = logging.getLogger("services.requests")
# A view's attribute marking an edge route (its requests write completion lines).
EDGE_ROUTE = "edge_route"


def _as_json(reply: Any) -> dict:
    """A final answer as the hop's JSON (every field it knows)."""
    return reply.wire()


@dataclass(frozen=True)
class Call:
    """One request as its route parsed it, ready to be answered."""
    answer: Callable[[Deadline], AnswerStream]  # its answer stream, by the deadline
    stream: bool = False  # streamed as `events` writes it, else the reply collected as JSON (`reply`)
    reply: Callable[[Any], dict] = _as_json  # the collected final answer (or n choices') as the route's JSON
    events: Callable[[AnswerStream], Iterator[bytes]] = query_events
    timeout_s: float | None = None  # a deadline nearer than REQUEST_TIMEOUT_S (a forward's time left)


@dataclass
class Edge:
    """A node's edge: its readiness, its body and time limits, and the routes served through it."""
    lifecycle: Lifecycle
    limits: LimitsSettings

    def add(self, app: Flask, path: str, parse: Callable[[dict], Call], *, params: Mapping[str, str] | None = None,
            guard: Callable[[Callable], Callable] | None = None) -> None:
        """Serve POST `path` through the edge; `params`: the route's names for the service's fields in
        its errors; `guard`: a decorator checked before the edge (the cluster token)."""
        def view() -> Response:
            return self.serve(parse)

        view.__name__ = f"edge{path.replace('/', '_')}"
        setattr(view, EDGE_ROUTE, True)
        setattr(view, ERROR_PARAMS, dict(params or {}))
        app.add_url_rule(path, view.__name__, guard(view) if guard is not None else view, methods=["POST"])

    def serve(self, parse: Callable[[dict], Call]) -> Response:
        record = g.completion = completion.begin()
        self.lifecycle.require_ready()
        call = parse(read_json_object(self.limits.max_body_bytes))
        timeout_s = self.limits.request_timeout_s
        deadline = Deadline.after(timeout_s if call.timeout_s is None else min(call.timeout_s, timeout_s))
        events = _noting_served_by(call.answer(deadline), record)
        if call.stream:  # started here: a request refused before its first event gets its status
            return sse_response(started(events), call.events)
        return jsonify(call.reply(collect(events)))


def _noting_served_by(events: AnswerStream, record: completion.Completion) -> AnswerStream:
    """The stream as it is, its final answer's `served_by` noted for the completion line, its prompt
    tokens and finish reason for the metrics (n choices: the first choice's to land)."""
    try:
        for event in events:
            final = final_of(event)
            if isinstance(event, Computed):
                record.served_by = event.served_by
            elif final is not None and record.served_by is None:
                record.served_by = final.served_by
                if final.usage is not None:
                    record.prompt_tokens = final.usage.prompt_tokens
                record.finish_reason = final.finish_reason
            yield event
    finally:
        close(events)


def install_completion_log(app: Flask, also: Iterable[str] = ()) -> None:
    """One INFO line per request on an edge route (and on the paths `also`) when it ends (a stream:
    after its last event); ids as repr, so a newline in an id cannot forge a line."""
    others = frozenset(also)

    @app.teardown_request
    def _log(exc):
        rule = request.url_rule
        started_at = g.get("request_started")
        if rule is None or started_at is None:
            return
        if not getattr(app.view_functions.get(rule.endpoint), EDGE_ROUTE, False) and rule.rule not in others:
            return
        record = g.get("completion") or completion.Completion()
        f = {"id": g.get("trace_id"), "request_id": g.get("request_id"), "endpoint": request.path,
             "status": g.get("response_status", 500), "latency_ms": round((time.perf_counter() - started_at) * 1000, 1),
             "served_by": record.served_by, "stages_ms": dict(record.stages_ms)}
        stages = ",".join(f"{stage}:{ms:g}" for stage, ms in f["stages_ms"].items()) or "-"
        request_log.info("request done id=%r request_id=%r %s status=%d latency_ms=%.1f served_by=%s "
                         "stages_ms=%s", f["id"], f["request_id"], f["endpoint"], f["status"], f["latency_ms"],
                         f["served_by"], stages, extra={"fields": f})
