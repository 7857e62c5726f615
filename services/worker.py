"""A worker node's request path: every model stage behind its own BatchingService.

embed -> search (node 2, batched HTTP) -> fetch -> rerank -> generate ->
sentiment and toxicity at the same time. Each stage runs on its own thread,
so different requests are in different stages at once (a pipeline), while
the caller's thread just waits on futures with the request's deadline.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError, Future
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from pipeline import spec
from pipeline.config import BatchConfig
from pipeline.continuous import ContinuousEngine
from pipeline.generator import GenerationRequest
from pipeline.reranker import RerankRequest
from pipeline.spec import Stage
from pipeline.stages import Stages
from services.batching import BatchingService
from services.cache import LruCache
from services.errors import Overloaded, RequestTimeout, ServiceClosed, StageDown, StageFailed
from services.generation import ContinuousGenerationService
from services.request_ids import current_request_id
from services.node_client import IndexClient

log = logging.getLogger(__name__)

# Where Worker.answer records how long the request waited on each stage, for the node's completion
# log line: kept out of the reply, whose fields are the contract. Per thread (one request each).
_stage_times: ContextVar[dict[str, float] | None] = ContextVar("stage_times", default=None)


def collect_stage_times() -> dict[str, float]:
    """A dict this thread's next Worker.answer fills with {stage: ms waited}, even if it fails."""
    times: dict[str, float] = {}
    _stage_times.set(times)
    return times


@dataclass(frozen=True)
class ContinuousConfig:
    """The continuous-batching engine's bounds (GENERATE_MAX_BATCH, _MAX_TOKENS, _PREFILL_CHUNK)."""
    max_seqs: int
    max_tokens: int
    prefill_chunk: int
    max_queue: int
    inject_failure: str = "off"  # TEST ONLY: GENERATE_INJECT_FAILURE


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker reads of the settings, and nothing else."""
    batching: Mapping[Stage, BatchConfig]  # one per stage in spec.WORKER_STAGES
    request_timeout_s: float
    embed_cache_size: int
    continuous: ContinuousConfig | None  # None: static batches through generate()


@dataclass(frozen=True)
class SearchItem:
    """An embedding on its way to node 2, with the deadline of the request it belongs to."""
    vector: np.ndarray
    deadline: float
    request_id: str = ""  # sent to node 2 with its batch, to follow the request there


class Worker:
    def __init__(self, config: WorkerConfig, stages: Stages, index: IndexClient):
        self.config = config
        self.stages = stages
        self.index = index
        self._served = 0
        self._lock = threading.Lock()
        self.embed_cache = LruCache("embedding", config.embed_cache_size)
        batch_fns = {
            Stage.EMBED: stages.embedder,
            Stage.SEARCH: self._search_batch,
            Stage.FETCH: stages.store.fetch_batch,
            Stage.RERANK: stages.reranker.rerank,
            Stage.GENERATE: stages.generator.generate,
            Stage.SENTIMENT: stages.sentiment.classify,
            Stage.TOXICITY: stages.toxicity.classify,
        }
        self.services = {stage: self._service(stage, batch_fns[stage]) for stage in spec.WORKER_STAGES}

    def _service(self, stage: Stage, batch_fn):
        if stage == Stage.GENERATE and self.config.continuous is not None:
            c = self.config.continuous
            engine = ContinuousEngine(self.stages.generator, max_seqs=c.max_seqs, max_tokens=c.max_tokens,
                                      prefill_chunk=c.prefill_chunk)
            return ContinuousGenerationService(stage, engine, max_queue=c.max_queue, inject_failure=c.inject_failure)
        cfg = self.config.batching[stage]
        return BatchingService(stage, batch_fn, max_size=cfg.max_size, max_wait_ms=cfg.max_wait_ms,
                               max_queue=cfg.max_queue)

    def _search_batch(self, items: list[SearchItem]) -> list[list[int]]:
        # One HTTP call to node 2 for the whole batch. Retries run until the latest
        # deadline in the batch: a request that can still wait (node 2 restarting)
        # should get its answer; one whose deadline passed has stopped waiting anyway.
        deadline = max(item.deadline for item in items)
        ids, _ = self.index.search(np.stack([item.vector for item in items]), spec.TOP_K, deadline=deadline,
                                   request_ids=[item.request_id for item in items if item.request_id])
        return ids

    @staticmethod
    def _wait(stage: str, future: Future, deadline: float):
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:  # our deadline, or a stage that gave up at it (search retries)
            future.cancel()  # skipped by its stage if it has not started yet
            raise RequestTimeout("request timed out") from None
        except (Overloaded, ServiceClosed, CancelledError):
            raise
        except Exception as exc:
            raise StageFailed(stage, exc) from exc

    def _timed_wait(self, times: dict[str, float] | None):
        """_wait that also records each stage's wait (ms) in `times` when a caller collects them."""
        if times is None:
            return self._wait

        def wait(stage: str, future: Future, deadline: float):
            started = time.perf_counter()
            try:
                return self._wait(stage, future, deadline)
            finally:
                times[str(stage)] = round((time.perf_counter() - started) * 1000, 1)
        return wait

    def failure(self) -> StageDown | None:
        """A StageDown for the first stage whose thread died, or None while every stage serves."""
        for stage, svc in self.services.items():
            if svc.failure is not None:
                return StageDown(stage, svc.failure)
        return None

    def answer(self, request_id: str, query: str, timeout_s: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.config.request_timeout_s)
        down = self.failure()
        if down is not None:  # refused before any stage runs: the gateway tries the other worker at once
            raise down
        s, wait = self.services, self._timed_wait(_stage_times.get())
        vector = self.embed_cache.get(query)
        if vector is None:
            vector = wait(Stage.EMBED, s[Stage.EMBED].submit(query), deadline)
            self.embed_cache.put(query, vector)
        trace = current_request_id.get() or request_id
        ids = wait(Stage.SEARCH, s[Stage.SEARCH].submit(SearchItem(vector, deadline, trace)), deadline)
        documents = wait(Stage.FETCH, s[Stage.FETCH].submit(list(ids)), deadline)
        ranked = wait(Stage.RERANK, s[Stage.RERANK].submit(RerankRequest(query, tuple(documents))), deadline)
        response = wait(Stage.GENERATE, s[Stage.GENERATE].submit(
            GenerationRequest(query, tuple(r.document for r in ranked))), deadline)
        # Sentiment and toxicity depend only on the answer: both are queued before either is awaited.
        sentiment, toxicity = s[Stage.SENTIMENT].submit(response), s[Stage.TOXICITY].submit(response)
        try:
            reply = spec.answer_json(request_id, response, wait(Stage.SENTIMENT, sentiment, deadline),
                                     wait(Stage.TOXICITY, toxicity, deadline))
        finally:
            toxicity.cancel()  # a no-op once it ran; spares the stage if sentiment gave up first
        with self._lock:
            self._served += 1
        return reply

    @property
    def served(self) -> int:
        with self._lock:
            return self._served

    def stats(self) -> dict[Stage, object]:
        return {stage: svc.stats() for stage, svc in self.services.items()}

    def close(self, timeout: float | None = None) -> None:
        for svc in self.services.values():
            svc.close(timeout)
        self.index.close()
