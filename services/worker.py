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
from dataclasses import dataclass

import numpy as np

from pipeline import spec
from pipeline.config import Settings
from pipeline.generator import GenerationRequest
from pipeline.reranker import RerankRequest
from pipeline.continuous import ContinuousEngine
from pipeline.stages import Stages
from services.cache import LruCache
from services.batching import BatchingService
from services.errors import Overloaded, RequestTimeout, ServiceClosed, StageFailed
from services.generation import ContinuousGenerationService
from services.node_client import IndexClient

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class SearchItem:
    """An embedding on its way to node 2, with the deadline of the request it belongs to."""
    vector: np.ndarray
    deadline: float


class Worker:
    def __init__(self, settings: Settings, stages: Stages, index: IndexClient):
        self.settings = settings
        self.stages = stages
        self.index = index
        self._served = 0
        self._lock = threading.Lock()
        self.embed_cache = LruCache("embedding", settings.embed_cache_size)

        def service(stage: str, batch_fn) -> BatchingService:
            cfg = settings.batching(stage)
            return BatchingService(stage, batch_fn, max_size=cfg.max_size, max_wait_ms=cfg.max_wait_ms,
                                   max_queue=cfg.max_queue)

        self.services = {
            "embed": service("embed", stages.embedder),
            "search": service("search", self._search_batch),
            "fetch": service("fetch", stages.store.fetch_batch),
            "rerank": service("rerank", stages.reranker.rerank),
            "generate": self._generate_service(settings, stages, service),
            "sentiment": service("sentiment", stages.sentiment.classify),
            "toxicity": service("toxicity", stages.toxicity.classify),
        }

    @staticmethod
    def _generate_service(settings: Settings, stages: Stages, service):
        if settings.generate_mode == "static":
            return service("generate", stages.generator.generate)
        engine = ContinuousEngine(stages.generator, max_seqs=settings.generate_max_batch,
                                  max_tokens=settings.generate_max_tokens,
                                  prefill_chunk=settings.generate_prefill_chunk)
        return ContinuousGenerationService("generate", engine, max_queue=settings.stage_max_queue)

    def _search_batch(self, items: list[SearchItem]) -> list[list[int]]:
        # One HTTP call to node 2 for the whole batch. Retries run until the latest
        # deadline in the batch: a request that can still wait (node 2 restarting)
        # should get its answer; one whose deadline passed has stopped waiting anyway.
        deadline = max(item.deadline for item in items)
        ids, _ = self.index.search(np.stack([item.vector for item in items]), spec.TOP_K, deadline=deadline)
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

    def answer(self, request_id: str, query: str, timeout_s: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.settings.request_timeout_s)
        s, wait = self.services, self._wait
        vector = self.embed_cache.get(query)
        if vector is None:
            vector = wait("embed", s["embed"].submit(query), deadline)
            self.embed_cache.put(query, vector)
        ids = wait("search", s["search"].submit(SearchItem(vector, deadline)), deadline)
        documents = wait("fetch", s["fetch"].submit(list(ids)), deadline)
        ranked = wait("rerank", s["rerank"].submit(RerankRequest(query, tuple(documents))), deadline)
        response = wait("generate", s["generate"].submit(
            GenerationRequest(query, tuple(r.document for r in ranked))), deadline)
        # Sentiment and toxicity depend only on the answer: both are queued before either is awaited.
        sentiment, toxicity = s["sentiment"].submit(response), s["toxicity"].submit(response)
        try:
            reply = spec.answer_json(request_id, response, wait("sentiment", sentiment, deadline),
                                     wait("toxicity", toxicity, deadline))
        finally:
            toxicity.cancel()  # a no-op once it ran; spares the stage if sentiment gave up first
        with self._lock:
            self._served += 1
        return reply

    @property
    def served(self) -> int:
        with self._lock:
            return self._served

    def stats(self) -> dict:
        return {name: svc.stats() for name, svc in self.services.items()}

    def close(self, timeout: float | None = None) -> None:
        for svc in self.services.values():
            svc.close(timeout)
        self.index.close()
