"""Node 1's role (and what node 0's role holds): load and warm the models, serve /internal/answer
through the edge (services/server/edge.py), and the worker's answer and embeddings as this node
tells them: each final answer says which node computed it and how long it waited on each stage."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from flask import Flask
from flask import request as http_request

from pipeline import spec
from pipeline.config import Settings
from pipeline.config.checks import MAX_INTERNAL_TIMEOUT_S
from pipeline.data_version import EmbedderInfo, check_embedder
from pipeline.device import describe_placement
from pipeline.docstore import DocumentStore
from pipeline.embedder import identity as embedder_identity
from pipeline.stages import Stages
from services.cluster.sharded_index import CentroidRouters, ShardedIndexClient
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.data_routes import register_data_routes
from services.roles.loaded import Loaded
from services.roles.versioned_data import VersionedData
from services.roles.worker.metrics import WorkerCollector
from services.roles.worker.request_path import ContinuousConfig, Worker, WorkerConfig
from services.roles.worker.stage_clock import collect_stage_times
from services.server import completion
from services.server.answer import PIECES_HEADER, AnswerStream, FinalAnswer
from services.server.answer_request import AnswerRequest, Bounds, read_request
from services.server.deadline import Deadline
from services.server.edge import Call, Edge
from services.server.errors import ApiError
from services.server.stream_response import close, internal_events, internal_reply_events
from services.server.token import internal_endpoint

log = logging.getLogger(__name__)

# What a forward from the gateway may add to a body its client sent within MAX_BODY_BYTES: a generated
# request_id, `stream` and `timeout_s` (the text itself is sent as UTF-8, services/cluster/clients.py).
FORWARD_SLACK_BYTES = 1024


def worker_config(settings: Settings, device: str = "cpu") -> WorkerConfig:
    """What a worker whose models run on `device` reads of the settings."""
    generate = settings.generate
    continuous = ContinuousConfig(max_batch=generate.max_batch, kv_cache_tokens=generate.kv_cache_tokens,
                                  prefill_chunk=generate.prefill_chunk, max_queue=settings.limits.stage_max_queue)
    return WorkerConfig(batching={stage: settings.batching(stage, device) for stage in spec.WORKER_STAGES
                                  if stage != spec.Stage.GENERATE},
                        embed_cache_size=settings.embed.cache_size, continuous=continuous,
                        history_tokens=settings.limits.max_history_tokens, faiss_threads=settings.index.faiss_threads)


def versioned_documents(settings: Settings, embedder: EmbedderInfo) -> VersionedData[DocumentStore]:
    """The documents of each data version this worker holds; a version built by another embedder is
    refused (at startup: exit 2 naming both embedders)."""
    def open_version(directory, manifest) -> DocumentStore:
        check_embedder(manifest, embedder, directory)
        return DocumentStore(directory / settings.fetch.documents_dir.name)

    return VersionedData(settings.fetch.documents_dir, open_version, DocumentStore.close)


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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker: Loaded[Worker] = Loaded(f"node {self.node} is still loading its models")
        self.data: Loaded[VersionedData[DocumentStore]] = Loaded(f"node {self.node} is still loading its data")
        self._model_source = "loading"
        self._numerics: dict[str, Any] | None = None  # fixed once the models are loaded (numerics())
        # What a request body is checked against (the query's tokens: by the loaded LLM's tokenizer).
        self.bounds = worker_bounds(self.settings, lambda query: self.worker.require().count_query_tokens(query))

    @property
    def model_source(self) -> str:
        return self._model_source

    @staticmethod
    def check_settings(settings: Settings) -> None:
        settings.require_documents()

    @property
    def max_body_bytes(self) -> int:
        return self.settings.limits.max_body_bytes + FORWARD_SLACK_BYTES

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
        # Before the models load: a version built by another embedder is refused at once.
        ours = embedder_identity(settings, source)
        documents = versioned_documents(settings, ours)
        documents.load_startup()
        self.data.set(documents)
        for stage in spec.MODEL_STAGES:  # what each stage computes in, and why, before the slow load
            log.info("node %d computes %s", self.node, describe_placement(settings, stage))
        stages = Stages.load(settings, source)  # warmed by the Worker, through the engine that serves
        routers = CentroidRouters(settings.fetch.documents_dir, settings.index.faiss_index_path.name,
                                  settings.index.nprobe)
        index = ShardedIndexClient.from_cluster(settings.cluster, read_timeout_s=settings.search.timeout_s,
                                                routers=routers)
        # Read once: the CPU's flags and the kernels' builds do not change while the node runs, and /health
        # is polled often.
        self._numerics = {**stages.numerics(), "models": self._model_source}
        self.worker.set(Worker(worker_config(settings, stages.generator.placement.device), stages, index, documents))
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

    def numerics(self) -> dict[str, Any] | None:
        """What decides a reply's bits on this worker (pipeline.stages.Stages.numerics, and where its models came
        from), None until its models are loaded: the gateway compares its workers' with its own."""
        return self._numerics

    def health_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"model_source": self._model_source}
        data = self.data.value
        if data is not None:
            fields["data_version"] = data.current
            fields["data_versions"] = data.status()["loaded"]
        worker = self.worker.value
        if worker is not None:
            fields["device"] = worker.stages.devices()
            fields["numerics"] = self.numerics()
            fields["served"] = worker.served
            fields["stages"] = {str(stage): st.summary() for stage, st in worker.stats().items()}
        return fields

    def register_data_routes(self, app: Flask) -> None:
        """/data: what a rollout asks of this worker (node 0 registers its own worker's too)."""
        register_data_routes(app, self.data, self.lifecycle, self.settings.cluster.cluster_token)

    def register_routes(self, app: Flask) -> None:
        self.register_data_routes(app)
        # Each forward from the gateway gets its completion line here too: served_by and this node's stages.
        limits = dataclasses.replace(self.settings.limits, max_body_bytes=self.max_body_bytes)
        Edge(self.lifecycle, limits).add(app, "/internal/answer", self.internal_call,
                                                       guard=internal_endpoint(self.settings.cluster.cluster_token))

    def internal_call(self, body: dict) -> Call:
        """A forward from the gateway (which always asks for the stream, with its time left; its pieces
        only where its caller reads them: PIECES_HEADER), or a direct caller's request: streamed with
        `"stream": true` (every field of the answer: the hop's serializer), else one JSON reply."""
        request = read_request(body, self.bounds, also=("timeout_s",))
        pieces = http_request.headers.get(PIECES_HEADER, "").lower() != "none"
        return Call(lambda deadline: self.answer(request, deadline, first_piece_only=not pieces), stream=request.stream,
                    events=internal_events if pieces else internal_reply_events,
                    timeout_s=internal_timeout(body, self.settings))

    def answer(self, request: AnswerRequest, deadline: Deadline, first_piece_only: bool = False) -> AnswerStream:
        """The worker's answer stream, its final answer naming this node (`served_by`) and its stage
        times, which are also noted for this node's completion line (a failure's too)."""
        times = collect_stage_times()
        events = self.worker.require().answer(request, deadline, first_piece_only=first_piece_only)
        try:
            for event in events:
                yield dataclasses.replace(event, served_by=self.node, stages_ms=dict(times)) \
                    if isinstance(event, FinalAnswer) else event
        finally:
            close(events)
            completion.note_stages(times)

    def embed(self, texts: list[str], deadline: Deadline) -> list[np.ndarray]:
        """The worker's embeddings of `texts`; its embed stage's time noted for the completion line."""
        times = collect_stage_times()
        try:
            return self.worker.require().embed(texts, deadline)
        finally:
            completion.note_stages(times)
