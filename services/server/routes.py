"""A node's Flask app: the routes every role shares (/health, /live, /ready, /settings,
/cache/clear, /metrics), the completion log and the in-flight count, around the role's own routes.
/settings is for operators: it answers on loopback or with the cluster token.
"""
from __future__ import annotations

import configparser
import importlib.metadata
import logging
from typing import Any, Iterable, Protocol

from flask import Flask, jsonify

from pipeline.config import REPO_ROOT, Settings
from services.server.app import make_app
from services.server.edge import install_completion_log
from services.server.lifecycle import Lifecycle
from services.server.metrics import CacheCollector, InfoCollector, NodeMetrics
from services.server.token import internal_endpoint, operator_endpoint

log = logging.getLogger(__name__)
# /health's status when the node runs but a stage thread died (503: the gateway's probe drops it).
UNHEALTHY = "unhealthy"


class NodeRole(Protocol):
    """What the shared routes need of a node's role (services.roles.base.Role provides it)."""
    name: str
    node: int
    settings: Settings
    request_endpoints: tuple[str, ...]  # beyond its edge routes (services/server/edge.py)

    @property
    def model_source(self) -> str: ...

    def health_fields(self) -> dict[str, Any]: ...
    def failure(self) -> str | None: ...
    def caches(self) -> Iterable[Any]: ...
    def metered_caches(self) -> Iterable[Any]: ...
    def collectors(self) -> Iterable[Any]: ...
    def register_routes(self, app: Flask) -> None: ...


def health_body(role: NodeRole, lifecycle: Lifecycle) -> dict[str, Any]:
    readiness = lifecycle.readiness
    failure = role.failure() if readiness.ready else None
    status = UNHEALTHY if failure else ("healthy" if readiness.ready else readiness.state)
    body: dict[str, Any] = {"status": status, "node": role.node,
                            "total_nodes": role.settings.cluster.total_nodes, "role": role.name}
    body.update(role.health_fields())
    detail = failure or readiness.detail
    if detail:
        body["detail"] = detail
    return body


def _version() -> str:
    try:
        return importlib.metadata.version("rag-support-service")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout: setup.cfg says it
        parser = configparser.ConfigParser()
        parser.read(REPO_ROOT / "setup.cfg")
        return parser.get("metadata", "version", fallback="unknown")


VERSION = _version()


def node_info(role: NodeRole) -> dict[str, str]:
    """The labels of rag_node_info: which node, role, models and precision, and the code's version."""
    s = role.settings
    return {"node": str(role.node), "role": role.name, "model_source": role.model_source,
            "precision": s.models.precision, "version": VERSION}


def build_app(role: NodeRole, lifecycle: Lifecycle) -> Flask:
    app = make_app(f"node-{role.node}")
    install_completion_log(app, role.request_endpoints)
    lifecycle.in_flight.track(app)
    metrics = NodeMetrics()
    for collector in role.collectors():
        metrics.register(collector)
    metrics.register(CacheCollector(role.metered_caches))
    metrics.register(InfoCollector(lambda: node_info(role)))
    metrics.instrument(app)

    @app.get("/health")
    def health():
        body = health_body(role, lifecycle)
        return jsonify(body), (200 if body["status"] == "healthy" else 503)

    # Liveness for a supervisor: 200 in every state, which /ready and /health tell apart.
    @app.get("/live")
    def live():
        return jsonify({"status": "live", "node": role.node})

    # Readiness for a load balancer: /health's verdict without the role's details.
    @app.get("/ready")
    def ready():
        body = health_body(role, lifecycle)
        answer = {"ready": body["status"] == "healthy", "status": body["status"], "node": role.node}
        if body.get("detail"):
            answer["detail"] = body["detail"]
        return jsonify(answer), (200 if answer["ready"] else 503)

    settings_body = {"settings": role.settings.effective()}

    @app.get("/settings")
    @operator_endpoint(role.settings.cluster.cluster_token)
    def settings():
        return jsonify(settings_body)

    @app.post("/cache/clear")
    @internal_endpoint(role.settings.cluster.cluster_token)
    def cache_clear():
        cleared = {cache.name: cache.clear() for cache in role.caches()}
        log.info("caches cleared: %s", cleared)
        return jsonify({"cleared": cleared})

    role.register_routes(app)
    return app
