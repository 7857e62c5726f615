"""Node 1's role (and what node 0's role holds): load and warm the models, serve /internal/answer."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, g, jsonify

from pipeline import spec
from pipeline.config import Settings
from pipeline.config.checks import MAX_INTERNAL_TIMEOUT_S
from pipeline.device import describe_placement
from pipeline.stages import Stages
from services.cluster.sharded_index import ShardedIndexClient
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.loaded import Loaded
from services.roles.worker.metrics import WorkerCollector
from services.roles.worker.request_path import ContinuousConfig, Worker, WorkerConfig
from services.roles.worker.stage_clock import collect_stage_times
from services.server.answer_request import Bounds, read_request
from services.server.body import read_json_object
from services.server.errors import ApiError
from services.server.stream_response import AnswerStream, close, collect, sse_response, started
from services.server.token import internal_endpoint

log = logging.getLogger(__name__)


def worker_config(settings: Settings) -> WorkerConfig:
    generate = settings.generate
    continuous = ContinuousConfig(max_batch=generate.max_batch, kv_cache_tokens=generate.kv_cache_tokens,
                                  prefill_chunk=generate.prefill_chunk, max_queue=settings.limits.stage_max_queue)
    return WorkerConfig(batching={stage: settings.batching(stage) for stage in spec.WORKER_STAGES
                                  if stage != spec.Stage.GENERATE},
                        request_timeout_s=settings.limits.request_timeout_s,
                        embed_cache_size=settings.embed.cache_size, continuous=continuous)


def worker_bounds(settings: Settings, count_tokens: Callable[[str], int]) -> Bounds:
    """What a request body is checked against on this node (services.server.answer_request)."""
    return Bounds(settings.limits, count_tokens, max_new_tokens=settings.api.max_tokens_cap)


def internal_timeout(body: dict, settings: Settings) -> float:
    """The caller's time left (the gateway's deadline), never more than our own limit."""
    timeout_s = body.get("timeout_s", settings.limits.request_timeout_s)
    if type(timeout_s) not in (int, float) or not 0 < timeout_s <= MAX_INTERNAL_TIMEOUT_S:
        raise ApiError(400, f"'timeout_s' must be a number of seconds over 0 and at most {MAX_INTERNAL_TIMEOUT_S:g}",
                       field="timeout_s")
    return min(float(timeout_s), settings.limits.request_timeout_s)


class WorkerRole(Role):
    name = "worker"
    # Each forward from the gateway gets its completion line here too: served_by and this node's stages_ms.
    request_endpoints = ("/internal/answer",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker: Loaded[Worker] = Loaded(f"node {self.node} is still loading its models")
        self._model_source = "loading"
        # What a request body is checked against (the query's tokens: by the loaded LLM's tokenizer).
        self.bounds = worker_bounds(self.settings, lambda query: self.worker.require().count_query_tokens(query))

    @property
    def model_source(self) -> str:
        return self._model_source

    @staticmethod
    def check_settings(settings: Settings) -> None:
        settings.require_documents()

    def default_http_threads(self) -> int:
        # A request in flight holds one waitress thread while it waits on its futures. The
        # gateway admits at most GATEWAY_MAX_IN_FLIGHT, and on failover node 1 may get them all.
        return self.settings.gateway.max_in_flight + SPARE_HTTP_THREADS

    def load(self) -> None:
        from pipeline.models import resolve_model_source
        settings = self.settings
        source = resolve_model_source(settings)
        self._model_source = source.describe()
        started = time.monotonic()
        for stage in spec.MODEL_STAGES:  # what each stage computes in, and why, before the slow load
            log.info("node %d computes %s", self.node, describe_placement(settings, stage))
        stages = Stages.load(settings, source)
        stages.warm_up()
        index = ShardedIndexClient.from_cluster(settings.cluster, read_timeout_s=settings.search.timeout_s)
        self.worker.set(Worker(worker_config(settings), stages, index))
        log.info("node %d loaded and warmed its models in %.1fs (%s)", self.node, time.monotonic() - started,
                 self._model_source)

    def collectors(self):
        return (*super().collectors(), WorkerCollector(lambda: self.worker.value))

    def caches(self):
        worker = self.worker.value
        return (worker.embed_cache,) if worker is not None else ()

    def batching_services(self):
        worker = self.worker.value
        return worker.services.values() if worker is not None else ()

    def health_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"model_source": self._model_source}
        worker = self.worker.value
        if worker is not None:
            fields["device"] = worker.stages.devices()
            fields["served"] = worker.served
            fields["stages"] = {str(stage): st.summary() for stage, st in worker.stats().items()}
        return fields

    def register_routes(self, app: Flask) -> None:

        @app.post("/internal/answer")
        @internal_endpoint(self.settings.cluster.cluster_token)
        def internal_answer():
            """A forward from the gateway (which always asks for the stream), or a direct caller's
            request: streamed with `"stream": true`, else one JSON reply (the stream collected)."""
            self.lifecycle.require_ready()
            body = read_json_object(self.settings.limits.max_body_bytes)
            request = read_request(body, self.bounds)
            timeout_s = internal_timeout(body, self.settings)
            g.served_by, g.stage_times = self.node, collect_stage_times()  # for the completion line
            events = self._served_by(self.worker.require().answer(request, timeout_s))
            return sse_response(started(events)) if request.stream else jsonify(collect(events))

    def _served_by(self, events: AnswerStream) -> AnswerStream:
        try:
            for event in events:
                yield {**event, "served_by": self.node} if isinstance(event, dict) else event
        finally:
            close(events)
