"""What every node role provides; services.server.routes and services.node use nothing else."""
from __future__ import annotations

from typing import Any, Iterable

from flask import Flask

from pipeline.config import Settings
from services.server.lifecycle import Lifecycle
from services.stages.metrics import StageCollector

# HTTP threads beyond the requests a node computes at once, for /health, /metrics, joiners,
# cache hits and quick 503s while every computing thread waits.
SPARE_HTTP_THREADS = 32


class Role:
    name = ""  # the /health "role"
    uses_torch = True  # False: the node never imports torch (memory and start time)
    # Routes beyond the edge's (services/server/edge.py) whose requests each get one completion log line.
    request_endpoints: tuple[str, ...] = ()

    def __init__(self, settings: Settings, node: int, lifecycle: Lifecycle):
        self.settings = settings
        self.node = node
        self.lifecycle = lifecycle

    @staticmethod
    def check_settings(settings: Settings) -> None:
        """Raise ConfigError before anything starts if this role's files are missing."""

    @property
    def model_source(self) -> str:
        """Where its models came from, for /health and the node info metric."""
        return "none"

    @property
    def max_body_bytes(self) -> int:
        return self.settings.limits.max_body_bytes

    def load(self) -> None:
        """Load what the role serves (on the startup thread; /health says "starting" meanwhile)."""
        raise NotImplementedError

    def register_routes(self, app: Flask) -> None:
        raise NotImplementedError

    def health_fields(self) -> dict[str, Any]:
        """What this role adds to /health after status, node, total_nodes and role."""
        return {}

    def caches(self) -> Iterable:
        """What POST /cache/clear empties: answers that a change of models or documents makes stale."""
        return ()

    def metered_caches(self) -> Iterable:
        return self.caches()

    def batching_services(self) -> Iterable:
        return ()

    def collectors(self) -> Iterable:
        """Prometheus collectors of what this role runs (read at scrape time)."""
        return (StageCollector(self.batching_services),)

    def default_http_threads(self) -> int:
        raise NotImplementedError

    def http_threads(self) -> int:
        return self.settings.http.waitress_threads or self.default_http_threads()

    def stop(self) -> None:
        """Called once when the node starts draining."""

    def abort(self, reason: str) -> None:
        """At the end of SHUTDOWN_GRACE_S with requests in flight: every stage fails what it holds now."""
        for svc in self.batching_services():
            svc.abort(reason)

    def failure(self) -> str | None:
        """Why this node cannot serve though it runs (a stage thread died), else None."""
        for svc in self.batching_services():
            if svc.failure is not None:
                return f"the {svc.name} stage stopped: {svc.failure}"
        return None
