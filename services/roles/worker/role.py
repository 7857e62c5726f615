"""Node 1's role (and half of node 0's): load and warm the models, serve /internal/answer."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Callable

from flask import Flask, g, jsonify

from pipeline import spec
from pipeline.config import Settings
from pipeline.config.checks import MAX_INTERNAL_TIMEOUT_S
from pipeline.sampling_params import Sampling, SamplingError
from pipeline.stages import Stages
from services.cluster.sharded_index import ShardedIndexClient
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.worker.request_path import ContinuousConfig, Worker, WorkerConfig
from services.roles.worker.stage_clock import collect_stage_times
from services.server.body import read_json_object, require_string
from services.server.errors import ApiError, NodeNotReady
from services.server.request_ids import bind_request_id
from services.server.stream_response import sse_response, started
from services.server.token import internal_endpoint

log = logging.getLogger(__name__)


def worker_config(settings: Settings) -> WorkerConfig:
    continuous = None
    if settings.generate.mode == "continuous":
        continuous = ContinuousConfig(max_seqs=settings.generate.max_batch, max_tokens=settings.generate.max_tokens,
                                      prefill_chunk=settings.generate.prefill_chunk,
                                      max_queue=settings.limits.stage_max_queue,
                                      prefix_cache=settings.generate.prefix_cache)
    return WorkerConfig(batching={stage: settings.batching(stage) for stage in spec.WORKER_STAGES},
                        request_timeout_s=settings.limits.request_timeout_s,
                        embed_cache_size=settings.embed.cache_size, continuous=continuous)


def parse_query(settings: Settings, count_tokens: Callable[[str], int]) -> tuple[dict, str, str]:
    """The body of /query or /internal/answer, checked the same way on both.

    The query is bounded in characters (cheap, first) and then in the LLM tokenizer's tokens:
    the tokens bound the prompt, its KV reservation and its prefill, which characters do not
    (an emoji is four tokens).
    """
    body = read_json_object(settings.limits.max_body_bytes)
    request_id = require_string(body, "request_id", settings.limits.max_request_id_chars)
    bind_request_id(request_id)
    query = require_string(body, "query", settings.limits.max_query_chars)
    check_query_tokens(settings, count_tokens, query)
    return body, request_id, query


def check_query_tokens(settings: Settings, count_tokens: Callable[[str], int], query: str) -> None:
    """ApiError 400 (field query) for a query over MAX_QUERY_TOKENS of the LLM's tokenizer."""
    tokens = count_tokens(query)
    if tokens > settings.limits.max_query_tokens:
        raise ApiError(400, f"'query' is {tokens} tokens; the limit is {settings.limits.max_query_tokens} tokens "
                            "(MAX_QUERY_TOKENS, counted by the LLM's tokenizer)", field="query")


def wants_stream(body: dict) -> bool:
    """The body's `stream` (false when absent): true asks for the answer as Server-Sent Events."""
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise ApiError(400, "'stream' must be true or false", field="stream")
    return stream


def max_new_tokens(body: dict, limit: int = spec.MAX_NEW_TOKENS) -> int | None:
    """The body's `max_new_tokens` (the gateway's cap on a forwarded answer), None when absent."""
    value = body.get("max_new_tokens")
    if value is not None and (type(value) is not int or not 1 <= value <= limit):
        raise ApiError(400, f"'max_new_tokens' must be an integer from 1 to {limit}", field="max_new_tokens")
    return value


def sampling(body: dict) -> Sampling | None:
    """The body's `sampling` (the gateway's /v1 temperature, top_p, top_k, seed and stop), None when absent."""
    if body.get("sampling") is None:
        return None
    try:
        return Sampling.from_json(body["sampling"])
    except SamplingError as exc:
        raise ApiError(400, str(exc), field=exc.field) from None


def internal_timeout(body: dict, settings: Settings) -> float:
    """The caller's time left (the gateway's deadline), never more than our own limit."""
    timeout_s = body.get("timeout_s", settings.limits.request_timeout_s)
    if type(timeout_s) not in (int, float) or not 0 < timeout_s <= MAX_INTERNAL_TIMEOUT_S:
        raise ApiError(400, f"'timeout_s' must be a number of seconds over 0 and at most {MAX_INTERNAL_TIMEOUT_S:g}",
                       field="timeout_s")
    return min(float(timeout_s), settings.limits.request_timeout_s)


class WorkerRole(Role):
    name = "worker"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker: Worker | None = None
        self.model_source = "loading"

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
        self.model_source = source.describe()
        started = time.monotonic()
        stages = Stages.load(settings, source)
        stages.warm_up()
        index = ShardedIndexClient.from_cluster(settings.cluster, read_timeout_s=settings.search.timeout_s)
        self.worker = Worker(worker_config(settings), stages, index)
        log.info("node %d loaded and warmed its models in %.1fs (%s)", self.node, time.monotonic() - started,
                 self.model_source)

    def caches(self):
        return (self.worker.embed_cache,) if self.worker is not None else ()

    def batching_services(self):
        return self.worker.services.values() if self.worker is not None else ()

    def health_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"model_source": self.model_source}
        if self.worker is not None:
            fields["device"] = self.worker.stages.devices()
            fields["served"] = self.worker.served
            fields["stages"] = {str(stage): st.summary() for stage, st in self.worker.stats().items()}
        return fields

    def loaded_worker(self) -> Worker:
        """The worker, once load() has built it (the routes answer 503 until the node is ready)."""
        if self.worker is None:
            raise NodeNotReady(f"node {self.node} is still loading its models")
        return self.worker

    def count_query_tokens(self, query: str) -> int:
        return self.loaded_worker().stages.generator.count_tokens(query)

    # Each forward from the gateway gets its completion line here too: served_by and this node's stages_ms.
    request_endpoints = ("/internal/answer",)

    def register_routes(self, app: Flask) -> None:

        @app.post("/internal/answer")
        @internal_endpoint(self.settings.cluster.cluster_token)
        def internal_answer():
            self.lifecycle.require_ready()
            body, request_id, query = parse_query(self.settings, self.count_query_tokens)
            g.served_by, g.stage_times = self.node, collect_stage_times()  # for the completion line
            worker, timeout_s = self.loaded_worker(), internal_timeout(body, self.settings)
            cap = max_new_tokens(body, self.settings.api.max_tokens_cap)
            if wants_stream(body):  # its completion line comes at its first token, with the stages so far
                events = worker.answer_stream(request_id, query, timeout_s, cap, sampling(body))
                return sse_response(started(self._served_by(events)))
            reply = worker.answer(request_id, query, timeout_s, cap)
            reply["served_by"] = self.node
            return jsonify(reply)

    def _served_by(self, events: Iterator[str | dict]) -> Iterator[str | dict]:
        try:
            for event in events:
                yield {**event, "served_by": self.node} if isinstance(event, dict) else event
        finally:
            events.close()  # type: ignore[attr-defined]


