"""Node 0's gateway: the request_id rules, then the reply cache, then a worker.

Its own worker is called in-process (no HTTP hop to itself); node 1 over HTTP.
Three parts: the request_id rules and admission (idempotency.Idempotency), round robin
with failover (routing.Router) and health probing (probing.HealthProber). Every request
gets exactly one answer, and each request_id is computed once. The optional reply cache
(by normalised query) is consulted only by the id's own computation, behind the
request_id rules, so it can never overrule them: an id's answer never changes once given.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from pipeline.config.sections import GatewaySettings
from pipeline.sampling_params import Sampling
from services.roles.caches import LruCache, ResponseCache
from services.roles.gateway.idempotency import Idempotency
from services.roles.gateway.probing import HealthProber
from services.roles.gateway.routing import Router, WorkerTarget


class Gateway:
    """`answer(request_id, query, timeout_s)` for node 0's /query; `status()` and `stats()` for /health."""

    def __init__(self, targets: list[WorkerTarget], settings: GatewaySettings, *,
                 response_cache: ResponseCache | None = None):
        self.router = Router(targets)
        self.ids = Idempotency(max_in_flight=settings.max_in_flight, completed_cache_size=settings.idempotency_cache_size,
                               completed_ttl_s=settings.idempotency_ttl_s, max_joiners_per_id=settings.max_joiners_per_id,
                               max_joiners=settings.max_joiners, response_cache=response_cache)
        self.response_cache = response_cache
        self.prober = HealthProber(self.router, settings.health_interval_s)

    @property
    def targets(self) -> list[WorkerTarget]:
        return self.router.targets

    @property
    def completed(self) -> LruCache:
        """Replies by request_id (metered; never cleared: a retried request must get the reply it got)."""
        return self.ids.completed

    def answer(self, request_id: str, query: str, timeout_s: float, max_new_tokens: int | None = None) -> dict:
        return self.ids.answer(request_id, query, timeout_s,
                               lambda deadline: self._compute(request_id, query, deadline, max_new_tokens))

    def answer_stream(self, request_id: str, query: str, timeout_s: float,
                      max_new_tokens: int | None = None, sampling: Sampling | None = None) -> Iterator[str | dict]:
        """answer() as a stream: text pieces as a worker generates them, then the reply. The request_id
        rules apply as to answer(); the reply cache answers a hit but does not keep streamed replies."""
        return self.ids.answer_stream(request_id, query, timeout_s, lambda deadline: self.router.forward_stream(
            request_id, query, deadline, max_new_tokens, sampling))

    def _compute(self, request_id: str, query: str, deadline: float, max_new_tokens: int | None) -> dict:
        """The id's own computation: the reply cache when it is on (its hit, or the same question
        in flight), else a worker. A capped answer (max_new_tokens) is not the question's answer:
        it neither comes from nor goes to the reply cache."""
        cache = self.response_cache
        if cache is None or max_new_tokens is not None:
            return self.router.forward(request_id, query, deadline, max_new_tokens)
        # looked_up: the request_id rules have just counted this question's miss.
        return cache.answer(request_id, query, lambda: self.router.forward(request_id, query, deadline),
                            max(0.0, deadline - time.monotonic()), looked_up=True)

    def status(self) -> list[dict]:
        return self.router.status()

    def stats(self) -> dict:
        return self.ids.stats()

    def abandon(self, make_error: Callable[[], BaseException]) -> None:
        """Past the node's grace period: every request waiting on a worker (its joiners with it)
        is answered make_error() now, and none is routed again."""
        self.router.abandon(make_error)

    def close(self) -> None:
        self.prober.close()
