"""Node 0's role: a worker plus the gateway in front of it, serving the clients' /query."""
from __future__ import annotations

import logging
from typing import Any

from flask import Flask, g, jsonify, request

from pipeline.config import ConfigError, Settings
from services.cluster.clients import WorkerClient
from services.roles.base import SPARE_HTTP_THREADS
from services.roles.caches import ResponseCache
from services.roles.gateway.gateway import Gateway
from services.roles.gateway.metrics import GatewayCollector
from services.roles.gateway.openai_routes import MODEL_ID as OPENAI_MODEL_ID
from services.roles.gateway.openai_routes import STARTED_AT as OPENAI_STARTED_AT
from services.roles.gateway.openai_routes import register_openai_routes
from services.roles.gateway.public_api import register_public_api
from services.roles.gateway.routing import WorkerTarget, remote_target
from services.roles.worker.role import WorkerRole, parse_query, wants_stream
from services.roles.worker.stage_clock import collect_stage_times
from services.server import sse
from services.server.errors import NodeNotReady
from services.server.lifecycle import Readiness
from services.server.stream_response import sse_response, started

log = logging.getLogger(__name__)

# Our own worker exists once loaded and serves until the node stops (a stopping node
# refuses new requests before they reach the gateway): the local target's probe.
LOCAL_SERVING = (Readiness.STARTING, Readiness.READY, Readiness.STOPPING)


class GatewayRole(WorkerRole):
    name = "gateway+worker"
    # Its completion lines are the clients' requests (its own worker's work shows in their stages_ms).
    request_endpoints = ("/query",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gateway: Gateway | None = None
        self.response_cache = ResponseCache(self.settings.gateway.response_cache_size, self.settings.gateway.response_cache_ttl_s)

    @staticmethod
    def check_settings(settings: Settings) -> None:
        # Each joiner holds an HTTP thread: with the derived thread count, joiners must leave some
        # of the spare threads to /health and the quick 503s. (An explicit WAITRESS_THREADS is the
        # operator's own sum to make; README says so.)
        if not settings.http.waitress_threads and settings.gateway.max_joiners >= SPARE_HTTP_THREADS:
            raise ConfigError(f"GATEWAY_MAX_JOINERS='{settings.gateway.max_joiners}' is not valid: expected fewer "
                              f"than the {SPARE_HTTP_THREADS} spare HTTP threads node 0 has beyond "
                              f"GATEWAY_MAX_IN_FLIGHT (WAITRESS_THREADS=0), or /health and the 503s would starve")
        WorkerRole.check_settings(settings)

    def load(self) -> None:
        super().load()
        s = self.settings
        self.gateway = Gateway(self._targets(), s.gateway, response_cache=self.response_cache)

    def loaded_gateway(self) -> Gateway:
        """The gateway, once load() has built it (the routes answer 503 until the node is ready)."""
        if self.gateway is None:
            raise NodeNotReady(f"node {self.node} is still loading its models")
        return self.gateway

    def _targets(self) -> list[WorkerTarget]:
        targets = []
        for node in self.settings.cluster.rotation:
            if node == self.node:  # our own worker: an in-process call, no HTTP hop
                worker = self.loaded_worker()
                targets.append(WorkerTarget(node=node, answer=worker.answer, stream=worker.answer_stream, local=True,
                                            probe=lambda: self.lifecycle.readiness.state in LOCAL_SERVING))
            else:
                client = WorkerClient(self.settings.node_address(node).url,
                                      connect_timeout_s=self.settings.cluster.connect_timeout_s,
                                      token=self.settings.cluster.cluster_token)
                targets.append(remote_target(node, client))
        return targets

    def collectors(self):
        return (*super().collectors(), GatewayCollector(lambda: self.gateway))

    def caches(self):
        return (*super().caches(), self.response_cache)

    def metered_caches(self):
        # Replies kept by request_id are not cleared: a retried request must get the reply it got.
        completed = (self.gateway.completed,) if self.gateway is not None else ()
        return (*self.caches(), *completed)

    def peers(self) -> list[dict[str, Any]]:
        """The other nodes as this node reaches them (its NODE_<n>_IP settings): tools given only
        node 0's address (the profiling tools' --url) find every node's /metrics from here."""
        s = self.settings
        return [{"node": n, "role": s.cluster.role_of(n), "url": s.node_address(n).url}
                for n in s.cluster.nodes if n != self.node]

    def health_fields(self) -> dict[str, Any]:
        fields = super().health_fields()
        fields["peers"] = self.peers()
        if self.gateway is not None:
            fields["workers"] = self.gateway.status()
            fields["gateway"] = self.gateway.stats()
        return fields

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.close()

    def abandon(self, reason: str) -> None:
        # The gateway first: a request its own worker fails next must not fail over to another.
        if self.gateway is not None:
            self.gateway.abandon(lambda: NodeNotReady(f"{reason}; retry"))
        super().abandon(reason)

    def register_routes(self, app: Flask) -> None:
        # Not WorkerRole's /internal/answer: node 0 calls its worker in-process, and that
        # endpoint would let callers past the gateway's admission limit.
        app.post("/query")(self.query)
        register_openai_routes(app, self)
        register_public_api(app, self, generator_model=OPENAI_MODEL_ID, created=OPENAI_STARTED_AT)

    def query(self):
        self.lifecycle.require_ready()
        body, request_id, text = parse_query(self.settings, self.count_query_tokens)
        log.debug("query request_id=%r", request_id)  # repr: an id cannot forge log lines
        g.stage_times = collect_stage_times()  # filled when our own worker computes it
        timeout_s = self.settings.limits.request_timeout_s
        if wants_stream(body) or sse.MEDIA_TYPE in request.headers.get("Accept", ""):
            # Started here: a request refused before its first token gets its status, not a stream.
            return sse_response(started(self.loaded_gateway().answer_stream(request_id, text, timeout_s)))
        # The request_id rules come first and the reply cache only behind them (Gateway._compute):
        # an id's own answer always wins over a cached answer to the same question.
        reply = self.loaded_gateway().answer(request_id, text, timeout_s)
        g.served_by = reply.get("served_by")
        return jsonify(reply)
