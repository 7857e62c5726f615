"""The gateway's request_id rules: each id computed once, bound to its query, within capacity.

An id is its caller's (the API key it came with, services/server/auth.py; None without keys): the
same id from two keys is two ids, so one key never joins, replays nor collides with (409) another's.

The same id in flight joins the computation (its outcome, a failure included); a recently
completed one is answered from a bounded cache (failures are not cached). An id is bound to the
exact request it first came with (a sha256 of its query and the fields that shape its answer):
the same id with another is a 409. A reply-cache hit for a new id becomes that id's answer, so an
id's answer never changes once given. Distinct computations count against `max_in_flight`;
joiners are capped per id and in all; beyond any limit the gateway refuses at once (503).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable

from services.roles.caches import LruCache, ResponseCache
from services.roles.single_flight import Entry, Flight, SingleFlight
from services.server.answer import AnswerStream, FinalAnswer
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.errors import Overloaded, RequestIdConflict, RequestTimeout, ServiceClosed
from services.server.stream_response import relay, replay

# Retry-After bounds for a full gateway: no hammering, and no minutes-long hint from a slow average.
MIN_RETRY_AFTER_S, MAX_RETRY_AFTER_S = 1.0, 30.0


def request_digest(request: AnswerRequest) -> str:
    """What a request_id is bound to: the exact query, the conversation before it and the fields that
    shape its answer (not `stream`), hashed so the cache keeps no text."""
    asked = {k: v for k, v in request.wire().items() if k not in ("request_id", "stream")}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode("utf-8")).hexdigest()


# A request_id as its caller's own (caller, request_id): what flights and completed replies are keyed by.
ScopedId = tuple[str | None, str]


def scoped_id(request: AnswerRequest) -> ScopedId:
    return request.caller, request.request_id


class Idempotency:
    """Request_id → its completed reply, its computation in flight (with joiners), or a new one."""

    def __init__(self, *, max_in_flight: int = 96, completed_cache_size: int = 1024, completed_ttl_s: float = 300.0,
                 max_joiners_per_id: int = 8, max_joiners: int = 16, response_cache: ResponseCache | None = None):
        if max_in_flight < 1 or max_joiners_per_id < 0 or max_joiners < 0:
            raise ValueError("max_in_flight must be >= 1, the joiner caps >= 0")
        self.max_in_flight = max_in_flight
        self.max_joiners_per_id, self.max_joiners = max_joiners_per_id, max_joiners
        self.response_cache = response_cache
        self.flights = SingleFlight()  # by (caller, request_id); each flight's meta is its query digest
        # (query digest, reply) by (caller, request_id), oldest first; a ttl of 0 keeps none.
        self.completed = LruCache("idempotency", completed_cache_size if completed_ttl_s > 0 else 0,
                                  completed_ttl_s, refresh_on_read=False)
        # The counters and the latency average; taken last (inside the flights' lock, never around it).
        self._lock = threading.Lock()
        self._latency_ema_s = 0.0  # of successful computations, for the Retry-After hint
        self._rejected = self._rejected_joiners = self._conflicts = 0
        self._riders = 0  # computations in flight on a slot their request holds (n choices): not counted again

    def answer(self, request: AnswerRequest, deadline: Deadline, compute: Callable[[Deadline], AnswerStream], *,
               admitted: bool = False) -> AnswerStream:
        """The id's answer stream: a completed or joined reply replayed, else `compute(deadline)`'s
        events as they come; its reply is then the id's, its failure its joiners' too (not kept).
        `admitted`: it computes on a slot its request holds already (`admitted`, one per n choices)."""
        started = time.monotonic()
        request_id, digest = request.request_id, request_digest(request)
        key = scoped_id(request)
        riding = [admitted]  # counted in _riders until its flight is about to end (or it leads none)

        def alight() -> None:
            with self._lock:
                self._riders -= riding[0]
            riding[0] = False

        with self._lock:
            self._riders += admitted  # before its flight exists: an admission meanwhile does not count it
        try:
            entry = self.flights.enter(
                key, meta=digest, lookup=lambda: self._completed_reply(key, digest),
                admit_joiner=lambda flight, joining: self._admit_joiner(request_id, digest, flight, joining),
                admit_leader=lambda in_flight: self._admit_leader(request, digest, in_flight, admitted))
            if not entry.leads:
                alight()
                yield from replay(self._known_or_joined(entry, deadline))
                return

            def failed(exc: BaseException) -> None:
                alight()
                self.flights.fail(entry.held, exc if isinstance(exc, Exception) else
                                  ServiceClosed(f"the caller streaming request_id {request_id!r} left before its answer"))

            def landed(reply: FinalAnswer) -> None:
                alight()
                self._land(entry, key, digest, reply, started)

            yield from relay(lambda: compute(deadline), failed=failed, landed=landed)
        finally:
            alight()

    def _known_or_joined(self, entry: Entry, deadline: float) -> FinalAnswer:
        """A reply already known, or the one of the computation joined (the same id and query)."""
        if entry.value is not None:
            return entry.value
        try:
            return self.flights.wait(entry.held, deadline - time.monotonic()).result()
        except TimeoutError:  # our wait, or the computation's own timeout
            raise RequestTimeout("request timed out") from None

    def _land(self, entry: Entry, key: ScopedId, digest: str, reply: FinalAnswer, started: float) -> None:
        """Cache a successful reply (never a failure), then hand it to the joiners."""
        now = time.monotonic()
        if not reply.cached:  # a reply-cache hit says nothing about how long a computation takes
            with self._lock:
                self._latency_ema_s = 0.8 * self._latency_ema_s + 0.2 * (now - started) if self._latency_ema_s \
                    else now - started
        self.completed.put(key, (digest, reply))  # before the flight lands: no gap to recompute in
        self.flights.finish(entry.held, reply)

    # ------------------------------------------------------------------ the rules, run under the flights' lock

    def _completed_reply(self, key: ScopedId, digest: str) -> FinalAnswer | None:
        """A recently completed reply for this caller's id; expired entries are dropped on the way."""
        self.completed.purge_expired()
        entry = self.completed.get(key)
        if entry is None:
            return None
        self._check_same_query(key[1], entry[0], digest)
        return entry[1]

    def _check_same_query(self, request_id: str, known: str, digest: str) -> None:
        if known != digest:
            with self._lock:
                self._conflicts += 1
            raise RequestIdConflict(request_id)

    def _admit_joiner(self, request_id: str, digest: str, flight: Flight, joining: int) -> None:
        """Let one more caller wait on `flight`, or refuse it at once."""
        self._check_same_query(request_id, flight.meta, digest)
        if flight.joiners >= self.max_joiners_per_id:
            limit = f"{self.max_joiners_per_id} per request_id"
        elif joining >= self.max_joiners:
            limit = f"{self.max_joiners} in all"
        else:
            return
        with self._lock:
            self._rejected += 1
            self._rejected_joiners += 1
        raise Overloaded(f"too many callers waiting on a request_id in flight ({limit})",
                         retry_after_s=self._retry_after_s(time.monotonic() - flight.started))

    def _admit_leader(self, request: AnswerRequest, digest: str, in_flight: int, admitted: bool) -> FinalAnswer | None:
        """A reply-cache hit (now the id's answer: it takes no capacity), else a free slot (or the one
        its request holds: `admitted`) or a refusal. The reply cache holds only the question's own
        answer (greedy, uncapped, no stop strings)."""
        cache = self.response_cache
        hit = cache.get(request.request_id, request.query, caller=request.caller,
                        conversation=request.conversation_key) \
            if cache is not None and request.is_the_questions_answer else None
        if hit is not None:
            self.completed.put(scoped_id(request), (digest, hit))
            return hit
        if not admitted:
            self._admit(in_flight)
        return None

    def _admit(self, in_flight: int) -> None:
        """A free slot, or a refusal at once (the flights riding on their request's slot do not count)."""
        with self._lock:
            riders = self._riders
        if in_flight - riders >= self.max_in_flight:
            with self._lock:
                self._rejected += 1
            raise Overloaded(f"the gateway is at capacity ({self.max_in_flight} requests in flight)",
                             retry_after_s=self._retry_after_s())

    def admitted(self, open_stream: Callable[[], AnswerStream]) -> AnswerStream:
        """Work with no request_id of its own (an embeddings request, n choices) under the same capacity:
        it holds one of the max_in_flight slots while it runs, and is refused at once when none is free."""
        entry = self.flights.enter(object(), admit_leader=self._admit)  # a key of its own: never joined
        yield from relay(open_stream, landed=lambda reply: self.flights.finish(entry.held, None),
                         failed=lambda exc: self.flights.fail(entry.held, exc))

    # ------------------------------------------------------------------ bookkeeping

    def _retry_after_s(self, elapsed_s: float = 0.0) -> float:
        # With every slot busy, one frees about every (mean latency / slots) seconds; a joiner
        # refused is better off coming back about when its id's answer is due (and cached).
        with self._lock:
            latency_s = self._latency_ema_s
        estimate = latency_s - elapsed_s if elapsed_s else latency_s / self.max_in_flight
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def stats(self) -> dict:
        completed, flights = self.completed.stats(), self.flights.stats()
        with self._lock:
            return {"in_flight": flights.in_flight, "max_in_flight": self.max_in_flight,
                    "cached": completed.entries, "cache_hits": completed.hits, "joined": flights.joined,
                    "joining": flights.joining, "max_joiners": self.max_joiners,
                    "max_joiners_per_id": self.max_joiners_per_id, "rejected": self._rejected,
                    "rejected_joiners": self._rejected_joiners, "conflicts": self._conflicts}
