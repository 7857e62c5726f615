"""Node 0's role: the gateway, serving the clients' /query and /v1 routes, with a worker of its own."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from flask import Flask, request

from pipeline.config import ConfigError, Settings
from services.cluster.membership import Member, Membership, gateway_workers
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.caches import ResponseCache
from services.roles.gateway.chat_page import register_chat_page
from services.roles.gateway.front import Front
from services.roles.gateway.gateway import Gateway
from services.roles.gateway.metrics import GatewayCollector
from services.roles.gateway.openai_routes import register_openai_routes
from services.roles.gateway.public_api import register_public_api
from services.roles.gateway.routing import MemberTargets, WorkerTarget, remote_worker
from services.roles.gateway.tokenize_routes import Tokenizing, register_tokenize_routes
from services.roles.loaded import Loaded
from services.roles.worker.role import WorkerRole, worker_bounds
from services.server import sse
from services.server.edge import Call, Edge
from services.server.errors import NodeNotReady
from services.server.lifecycle import Readiness

log = logging.getLogger(__name__)

# Our own worker exists once loaded and serves until the node stops (a stopping node
# refuses new requests before they reach the gateway): the local target's probe.
LOCAL_SERVING = (Readiness.STARTING, Readiness.READY, Readiness.STOPPING)
# What /query's body may ask for (a cap on the answer is the /v1 API's; the contract fixes /query's): an
# optional `history` of earlier turns (pipeline/conversation.py).
QUERY_FIELDS = ("request_id", "query", "stream", "history")


class GatewayRole(Role):
    name = "gateway+worker"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Its own worker, called in-process; its /internal/answer is not served (past admission).
        self.worker_role = WorkerRole(self.settings, self.node, self.lifecycle)
        self.gateway: Loaded[Gateway] = Loaded(f"node {self.node} is still loading its models")
        self.response_cache = ResponseCache(self.settings.gateway.response_cache_size,
                                            self.settings.gateway.response_cache_ttl_s)
        bounds = worker_bounds(self.settings, lambda query: self.count_query_tokens(query))
        self.front = Front(Edge(self.lifecycle, self.settings.limits), bounds, self.gateway)
        self.workers: Membership | None = None  # the workers routed to, once loaded

    @property
    def model_source(self) -> str:
        return self.worker_role.model_source

    @staticmethod
    def check_settings(settings: Settings) -> None:
        # Each joiner holds an HTTP thread: with the derived thread count, joiners must leave some
        # of the spare threads to /health and the quick 503s.
        if not settings.http.waitress_threads and settings.gateway.max_joiners >= SPARE_HTTP_THREADS:
            raise ConfigError(f"GATEWAY_MAX_JOINERS='{settings.gateway.max_joiners}' is not valid: expected fewer "
                              f"than the {SPARE_HTTP_THREADS} spare HTTP threads node 0 has beyond "
                              f"GATEWAY_MAX_IN_FLIGHT (WAITRESS_THREADS=0), or /health and the 503s would starve")
        WorkerRole.check_settings(settings)

    def default_http_threads(self) -> int:
        return self.worker_role.default_http_threads()

    def load(self) -> None:
        self.worker_role.load()
        gateway = Gateway([], self.settings.gateway, response_cache=self.response_cache)
        self.workers = gateway_workers(self.settings.cluster, self.node)
        self.workers.subscribe(MemberTargets(gateway.router, self._target).on_change).start()
        self.gateway.set(gateway)

    def count_query_tokens(self, query: str) -> int:
        return self.worker_role.worker.require().count_query_tokens(query)

    def tokenizing(self) -> Tokenizing:
        """The loaded LLM's tokenizer and context length, for /tokenize and /detokenize."""
        generator = self.worker_role.worker.require().stages.generator
        return Tokenizing(generator.tokens, getattr(generator.model.config, "max_position_embeddings", None))

    def _target(self, member: Member) -> WorkerTarget:
        if member.name == self.node:  # our own worker: an in-process call, no HTTP hop
            return WorkerTarget(node=self.node, answer=self.worker_role.answer, local=True,
                                probe=lambda: self.lifecycle.readiness.state in LOCAL_SERVING,
                                numerics=self.worker_role.numerics())
        cluster = self.settings.cluster
        return remote_worker(member, connect_timeout_s=cluster.connect_timeout_s, token=cluster.cluster_token)

    def collectors(self):
        return (*super().collectors(), GatewayCollector(lambda: self.gateway.value))

    def caches(self):
        return (*self.worker_role.caches(), self.response_cache)

    def metered_caches(self):
        # Replies kept by request_id are not cleared: a retried request must get the reply it got.
        gateway = self.gateway.value
        return (*self.caches(), *((gateway.completed,) if gateway is not None else ()))

    def batching_services(self):
        return self.worker_role.batching_services()

    def peers(self) -> list[dict[str, Any]]:
        """The other nodes as this node reaches them: tools given node 0's address find the rest here."""
        s = self.settings
        return [{"node": n, "role": s.cluster.role_of(n), "url": s.node_address(n).url}
                for n in s.cluster.nodes if n != self.node]

    def health_fields(self) -> dict[str, Any]:
        fields = {**self.worker_role.health_fields(), "peers": self.peers()}
        gateway = self.gateway.value
        if gateway is not None:
            fields["workers"] = gateway.status()
            fields["gateway"] = gateway.stats()
        return fields

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.close()
        if self.gateway.value is not None:
            self.gateway.value.close()

    def abort(self, reason: str) -> None:
        # The gateway first: a request its own worker fails next must not fail over to another.
        if self.gateway.value is not None:
            self.gateway.value.abort(lambda: NodeNotReady(f"{reason}; retry"))
        self.worker_role.abort(reason)

    def register_routes(self, app: Flask) -> None:
        # Every answering route enters by the edge: its completion lines are the clients' requests (its
        # own worker's work shows in their stages_ms).
        self.front.edge.add(app, "/query", self.query)
        self.worker_role.register_data_routes(app)  # a rollout switches node 0's own worker too
        api = self.settings.api
        register_openai_routes(app, self.front, api.default_temperature, api.max_tokens_cap,
                               embedder_model=self.settings.embed.model)
        register_public_api(app, api, self.front, self.worker_role, self.node)
        register_tokenize_routes(app, self.front, lambda: self.tokenizing())
        register_chat_page(app, api_keys_on=api.api_keys_file is not None)

    def query(self, body: dict) -> Call:
        """POST /query: streamed (`"stream": true`, or Accept: text/event-stream), else collected into
        the contract's reply (with `served_by`)."""
        asked = self.front.request(body, QUERY_FIELDS)
        if sse.MEDIA_TYPE in request.headers.get("Accept", ""):
            asked = dataclasses.replace(asked, stream=True)
        log.debug("query request_id=%r", asked.request_id)  # repr: an id cannot forge log lines
        return Call(self.front.answer(asked), stream=asked.stream,
                    reply=lambda answer: answer.query_reply(streamed=False))
