"""Node 0's role: a worker plus the gateway in front of it, serving the clients' /query."""
from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, jsonify

from services.cache import ResponseCache
from services.errors import RequestTimeout
from services.gateway import Gateway, Target, remote_target
from services.lifecycle import Readiness
from services.node_client import WorkerClient
from services.roles.worker import WorkerRole, parse_query

log = logging.getLogger(__name__)

# Our own worker exists once loaded and serves until the node stops (a stopping node
# refuses new requests before they reach the gateway): the local target's probe.
LOCAL_SERVING = (Readiness.STARTING, Readiness.READY, Readiness.STOPPING)


class GatewayRole(WorkerRole):
    name = "gateway+worker"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gateway: Gateway | None = None
        self.response_cache = ResponseCache(self.settings.response_cache_size, self.settings.response_cache_ttl_s)

    def load(self) -> None:
        super().load()
        s = self.settings
        self.gateway = Gateway(self._targets(), health_interval_s=s.health_interval_s,
                               max_in_flight=s.gateway_max_in_flight, completed_cache_size=s.idempotency_cache_size,
                               completed_ttl_s=s.idempotency_ttl_s)

    def _targets(self) -> list[Target]:
        targets = []
        for node in self.settings.worker_nodes:
            if node == self.node:  # our own worker: an in-process call, no HTTP hop
                targets.append(Target(node=node, answer=self.worker.answer, local=True,
                                      probe=lambda: self.lifecycle.readiness.state in LOCAL_SERVING))
            else:
                client = WorkerClient(self.settings.node_address(node).url,
                                      connect_timeout_s=self.settings.connect_timeout_s,
                                      token=self.settings.cluster_token)
                targets.append(remote_target(node, client))
        return targets

    def caches(self):
        return (*super().caches(), self.response_cache)

    def metered_caches(self):
        # Replies kept by request_id are not cleared: a retried request must get the reply it got.
        completed = (self.gateway.completed,) if self.gateway is not None else ()
        return (*self.caches(), *completed)

    def health_fields(self) -> dict[str, Any]:
        fields = super().health_fields()
        if self.gateway is not None:
            fields["workers"] = self.gateway.status()
            fields["gateway"] = self.gateway.stats()
        return fields

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.close()

    def register_routes(self, app: Flask) -> None:
        super().register_routes(app)
        app.post("/query")(self.query)

    def query(self):
        self.lifecycle.require_ready()
        _, request_id, text = parse_query(self.settings)
        log.info("query request_id=%r", request_id)  # repr: an id cannot forge log lines
        started = time.monotonic()
        claim = self.response_cache.claim(request_id, text)
        if claim.reply is not None:
            return jsonify(claim.reply)
        if claim.leader is not None:  # the same question is being answered right now
            reply = self._joined(claim.leader, request_id)
            if reply is not None:
                return jsonify(reply)
            # That computation failed; a failure is not shared: answer this one ourselves.
        timeout_s = self.settings.request_timeout_s - (time.monotonic() - started)
        try:
            reply = self.gateway.answer(request_id, text, timeout_s)
        except BaseException as exc:  # whatever it was, the waiting repeats must not wait on us
            self.response_cache.abandon(claim.key, exc)
            raise
        self.response_cache.finish(claim.key, reply)
        return jsonify(reply)

    def _joined(self, leader, request_id: str) -> dict | None:
        try:
            return self.response_cache.joined_reply(leader, request_id, self.settings.request_timeout_s)
        except TimeoutError:
            raise RequestTimeout("timed out waiting for the same question in flight") from None
