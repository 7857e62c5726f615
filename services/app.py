"""A node's Flask app: the routes every role shares around the role's own.

Shared: GET /health (503 until ready), POST /cache/clear, /metrics, the in-flight
count the drain waits on, and the one error handler (services.http.make_app).
"""
from __future__ import annotations

import logging
from typing import Any

from flask import Flask, jsonify

from services.http import internal_endpoint, make_app
from services.lifecycle import Lifecycle
from services.metrics import CacheCollector, GatewayCollector, NodeMetrics
from services.roles.base import Role

log = logging.getLogger(__name__)


# /health's status when the node runs but a stage thread died (503: the gateway's probe drops it).
UNHEALTHY = "unhealthy"


def health_body(role: Role, lifecycle: Lifecycle) -> dict[str, Any]:
    readiness = lifecycle.readiness
    failure = role.failure() if readiness.ready else None
    status = UNHEALTHY if failure else ("healthy" if readiness.ready else readiness.state)
    body: dict[str, Any] = {"status": status, "node": role.node,
                            "total_nodes": role.settings.total_nodes, "role": role.name}
    body.update(role.health_fields())
    detail = failure or readiness.detail
    if detail:
        body["detail"] = detail
    return body


def build_app(role: Role, lifecycle: Lifecycle) -> Flask:
    app = make_app(f"node-{role.node}")
    lifecycle.in_flight.track(app)
    metrics = NodeMetrics(role.batching_services)
    metrics.register(GatewayCollector(lambda: role.gateway))
    metrics.register(CacheCollector(role.metered_caches))
    metrics.instrument(app)

    @app.get("/health")
    def health():
        body = health_body(role, lifecycle)
        return jsonify(body), (200 if body["status"] == "healthy" else 503)

    @app.post("/cache/clear")
    @internal_endpoint(role.settings.cluster_token)
    def cache_clear():
        cleared = {cache.name: cache.clear() for cache in role.caches()}
        log.info("caches cleared: %s", cleared)
        return jsonify({"cleared": cleared})

    role.register_routes(app)
    return app
