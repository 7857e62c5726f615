"""Node 0's gateway: the request_id rules and admission (idempotency), then the optional reply
cache (behind the rules, so it never overrules them), then a worker (routing, with failover
and probing), its own in-process and the others over HTTP.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from pipeline.config.sections import GatewaySettings
from services.roles.caches import LruCache, ResponseCache
from services.roles.gateway.idempotency import Idempotency
from services.roles.gateway.routing import Router, WorkerTarget
from services.server.answer import AnswerStream
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline


class Gateway:
    """`answer(request, deadline)` and `admitted(work)` for node 0's routes; `status()` and `stats()`
    for /health."""

    def __init__(self, targets: list[WorkerTarget], settings: GatewaySettings, *,
                 response_cache: ResponseCache | None = None):
        self.router = Router(targets)
        self.ids = Idempotency(max_in_flight=settings.max_in_flight, completed_cache_size=settings.idempotency_cache_size,
                               completed_ttl_s=settings.idempotency_ttl_s, max_joiners_per_id=settings.max_joiners_per_id,
                               max_joiners=settings.max_joiners, response_cache=response_cache)
        self.response_cache = response_cache
        self._closed = threading.Event()
        threading.Thread(target=self._probe, args=(settings.health_interval_s,), name="gateway-prober",
                         daemon=True).start()

    @property
    def completed(self) -> LruCache:
        """Replies by request_id (metered; never cleared: a retried request must get the reply it got)."""
        return self.ids.completed

    def answer(self, request: AnswerRequest, deadline: Deadline, *, admitted: bool = False) -> AnswerStream:
        """The request's answer stream: the request_id rules first, then _compute; `admitted`: on a slot
        its request holds already (one of n choices)."""
        return self.ids.answer(request, deadline, lambda deadline: self._compute(request, deadline), admitted=admitted)

    def choices(self, requests: Sequence[AnswerRequest], deadline: Deadline,
                combine: Callable[[list[Callable[[], AnswerStream]]], AnswerStream]) -> AnswerStream:
        """n choices of one request (openai_choices.py) on one admission slot, as vLLM admits them: a full
        gateway refuses the request once, whole; each choice keeps its own request_id rules.
        `combine`: the choices' streams as the request's."""
        def stream(one: AnswerRequest) -> Callable[[], AnswerStream]:
            return lambda: self.answer(one, deadline, admitted=True)
        return self.ids.admitted(lambda: combine([stream(one) for one in requests]))

    def admitted(self, work: Callable[[], AnswerStream]) -> AnswerStream:
        """Work that is no answer (embeddings) under the same admission: a slot of GATEWAY_MAX_IN_FLIGHT."""
        return self.ids.admitted(work)

    def _compute(self, request: AnswerRequest, deadline: Deadline) -> AnswerStream:
        """The reply cache (only for the question's own answer: greedy, uncapped, no stop strings),
        else a worker."""
        cache = self.response_cache
        if cache is None or not request.is_the_questions_answer:
            return self.router.forward(request, deadline)
        # looked_up: the request_id rules have just counted this question's miss.
        return cache.answer(request.request_id, request.query, lambda: self.router.forward(request, deadline),
                            deadline, caller=request.caller, conversation=request.conversation_key, looked_up=True)

    def status(self) -> list[dict]:
        return self.router.status()

    def stats(self) -> dict:
        return self.ids.stats()

    def abort(self, make_error: Callable[[], BaseException]) -> None:
        """Answer every request waiting on a worker with make_error() now; route none again."""
        self.router.abort(make_error)

    def _probe(self, interval_s: float) -> None:
        """The workers' health probes: the first round at once, then one every interval_s until closed."""
        while True:
            self.router.probe_once()
            if self._closed.wait(interval_s):
                return

    def close(self) -> None:
        self._closed.set()

