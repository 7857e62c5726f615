"""Node 0's gateway: round robin over the workers, skipping any that is not ready.

Its own worker is called in-process (no HTTP hop to itself); node 1 over HTTP.
A forward that fails because the worker cannot be reached, is not ready or
is full is served by the next worker; a worker that could not be reached,
refused our cluster token or answered 503 leaves the rotation until a
background probe sees it healthy again. A request a worker failed (a 500)
is that request's error alone: the worker stays in the rotation.

Every request gets exactly one answer, and each request_id is computed once:
the same id in flight joins the computation, a recently completed one is
answered from a bounded cache (failures are not cached: a retry recomputes).
A request_id is bound to the exact query text it first came with (a sha256 of
it is kept, not the text): the same id with another query is refused with 409,
so nobody who guesses an id can read or plant its answer. The optional reply
cache (by normalised query) is consulted only by the id's own computation, so
an id's answer never changes once given.
Only distinct computations count against `max_in_flight`; joiners, each holding
an HTTP thread while it waits, are capped per id and in all. Beyond any limit
the gateway refuses at once (Overloaded -> 503 + Retry-After) instead of queueing.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from services.roles.caches import LruCache, ResponseCache
from services.server.errors import (NodeError, NodeUnreachable, NoWorkerAvailable, Overloaded, RequestIdConflict,
                             RequestTimeout, ServiceClosed, StageFailed, WorkerFailed)
from services.cluster.clients import WorkerClient

log = logging.getLogger(__name__)

# Retry-After bounds for a full gateway: at least a second (no hammering), at
# most half a minute (a slow average must not send clients away for minutes).
MIN_RETRY_AFTER_S, MAX_RETRY_AFTER_S = 1.0, 30.0


@dataclass
class Target:
    """One worker the gateway can send a request to."""
    node: int
    answer: Callable[[str, str, float], dict]  # (request_id, query, timeout_s) -> reply
    probe: Callable[[], bool]  # is it ready to serve?
    local: bool = False
    up: bool = True
    forwarded: int = 0
    failures: int = 0


def query_digest(query: str) -> str:
    """What a request_id is bound to: the exact text as received (no normalisation, since the
    models see it exactly), hashed so the cache keeps no query text."""
    return hashlib.sha256(query.encode("utf-8")).hexdigest()


@dataclass
class Flight:
    """One request_id being computed: what its callers wait on, and who may join it."""
    future: Future
    digest: str
    started: float
    joiners: int = 0


class Gateway:
    def __init__(self, targets: list[Target], *, health_interval_s: float = 2.0, max_in_flight: int = 96,
                 completed_cache_size: int = 1024, completed_ttl_s: float = 300.0, max_joiners_per_id: int = 8,
                 max_joiners: int = 16, response_cache: ResponseCache | None = None):
        if not targets:
            raise ValueError("the gateway needs at least one worker")
        if max_in_flight < 1 or max_joiners_per_id < 0 or max_joiners < 0:
            raise ValueError("max_in_flight must be >= 1, the joiner caps >= 0")
        self.targets = targets
        self.max_in_flight = max_in_flight
        self.max_joiners_per_id, self.max_joiners = max_joiners_per_id, max_joiners
        self.response_cache = response_cache
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._in_flight: dict[str, Flight] = {}
        # (query digest, reply) by request_id, oldest first; a ttl of 0 keeps none.
        self.completed = LruCache("idempotency", completed_cache_size if completed_ttl_s > 0 else 0,
                                  completed_ttl_s, refresh_on_read=False)
        self._latency_ema_s = 0.0  # of successful computations, for the Retry-After hint
        self._rejected = self._rejected_joiners = self._conflicts = 0
        self._joined = self._joining = 0
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, args=(health_interval_s,),
                                        name="gateway-prober", daemon=True)
        self._prober.start()

    # ------------------------------------------------------------------ routing

    def _rotation(self) -> list[Target]:
        """The workers in round-robin order from the next turn, ready ones only."""
        with self._lock:
            start = next(self._turn)
            order = [self.targets[(start + i) % len(self.targets)] for i in range(len(self.targets))]
            return [t for t in order if t.up]

    def _mark(self, target: Target, up: bool, why: str = "") -> None:
        with self._lock:
            changed = target.up != up
            target.up = up
            if not up:
                target.failures += 1
        if changed:  # rejoining is the normal end of a start or restart; leaving is worth a look
            log.log(logging.INFO if up else logging.WARNING, "worker node %d %s%s", target.node,
                    "rejoins the rotation" if up else "leaves the rotation", f": {why}" if why else "")

    def _forward(self, request_id: str, query: str, deadline: float) -> dict:
        candidates = self._rotation()
        if not candidates:
            # Everyone looks down: try them all once rather than refuse outright.
            candidates = list(self.targets)
        last_error: Exception | None = None
        for target in candidates:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeout("request timed out")
            try:
                reply = target.answer(request_id, query, remaining)
            except (Overloaded, ServiceClosed) as exc:  # our own worker is full or stopping: try the next
                last_error = exc
                continue
            except NodeUnreachable as exc:  # down: whatever it had started died with it
                self._mark(target, False, str(exc))
                last_error = exc
                continue
            except NodeError as exc:
                if exc.status == 504:
                    raise RequestTimeout(exc.message) from None
                if exc.status == 503:  # not ready, stopping or full: nothing computed, try the next
                    self._mark(target, False, f"HTTP 503: {exc.message}")
                    last_error = exc
                    continue
                if exc.status == 401:  # CLUSTER_TOKEN differs between nodes: say so loudly, use the others
                    log.error("worker node %d refused our cluster token: set the same CLUSTER_TOKEN on every node",
                              target.node)
                    self._mark(target, False, "refused our cluster token")
                    last_error = exc
                    continue
                # Any other error (a 500 included) belongs to this request alone: the worker answered,
                # so it stays in the rotation (only unreachability, 401 and 503 take it out).
                raise WorkerFailed(target.node, str(exc)) from None
            except StageFailed as exc:  # our own worker failed this request alone
                raise WorkerFailed(target.node, str(exc)) from None
            except TimeoutError:  # RequestTimeout, or node 1 did not answer by the deadline
                raise RequestTimeout("request timed out") from None
            with self._lock:
                target.forwarded += 1
            reply.setdefault("served_by", target.node)
            return reply
        if isinstance(last_error, Overloaded):
            raise last_error
        raise NoWorkerAvailable(f"no worker could serve the request ({last_error})")

    def _compute(self, request_id: str, query: str, deadline: float) -> dict:
        """The id's own computation: the reply cache when it is on (its hit, or the same question
        in flight), else a worker. Behind the request_id rules, so it can never overrule them."""
        cache = self.response_cache
        if cache is None:
            return self._forward(request_id, query, deadline)
        claim = cache.claim(request_id, query, looked_up=True)  # _claim counted its miss
        if claim.reply is not None:
            return claim.reply
        if claim.leader is not None:
            try:
                reply = cache.joined_reply(claim.leader, request_id, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise RequestTimeout("timed out waiting for the same question in flight") from None
            if reply is not None:
                return reply
            # That computation failed; a failure is not shared: answer this one ourselves.
        try:
            reply = self._forward(request_id, query, deadline)
        except BaseException as exc:  # whatever it was, the waiting repeats must not wait on us
            cache.abandon(claim.key, exc)
            raise
        cache.finish(claim.key, reply)
        return reply

    # ------------------------------------------------------------------ idempotency and capacity

    def _cached(self, request_id: str, digest: str) -> dict | None:
        """A recently completed reply for this id; expired entries are dropped on the way."""
        self.completed.purge_expired()
        entry = self.completed.get(request_id)
        if entry is None:
            return None
        self._check_same_query(request_id, entry[0], digest)
        return entry[1]

    def _check_same_query(self, request_id: str, known: str, digest: str) -> None:
        if known != digest:
            self._conflicts += 1
            raise RequestIdConflict(request_id)

    def _remember(self, request_id: str, digest: str, reply: dict, started: float) -> None:
        """Cache a successful reply (never a failure); lock held."""
        now = time.monotonic()
        if not reply.get("cached"):  # a reply-cache hit says nothing about how long a computation takes
            self._latency_ema_s = 0.8 * self._latency_ema_s + 0.2 * (now - started) if self._latency_ema_s \
                else now - started
        self.completed.put(request_id, (digest, reply))

    def _retry_after_s(self, elapsed_s: float = 0.0) -> float:
        # With every slot busy, one frees about every (mean latency / slots) seconds; a joiner
        # refused is better off coming back about when its id's answer is due (and cached).
        if elapsed_s:
            estimate = self._latency_ema_s - elapsed_s
        else:
            estimate = self._latency_ema_s / self.max_in_flight
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def _admit_joiner(self, flight: Flight) -> None:
        """Count one more caller waiting on `flight`, or refuse it at once; lock held."""
        if flight.joiners >= self.max_joiners_per_id:
            limit = f"{self.max_joiners_per_id} per request_id"
        elif self._joining >= self.max_joiners:
            limit = f"{self.max_joiners} in all"
        else:
            flight.joiners += 1
            self._joining += 1
            self._joined += 1
            return
        self._rejected += 1
        self._rejected_joiners += 1
        raise Overloaded(f"too many callers waiting on a request_id in flight ({limit})",
                         retry_after_s=self._retry_after_s(time.monotonic() - flight.started))

    def _claim(self, request_id: str, query: str, digest: str,
               started: float) -> tuple[dict | None, Flight | None, bool]:
        """Under the lock: (cached reply, None, _) or (None, the flight, whether we own it)."""
        with self._lock:
            cached = self._cached(request_id, digest)
            if cached is not None:
                return cached, None, False
            flight = self._in_flight.get(request_id)
            if flight is not None:
                self._check_same_query(request_id, flight.digest, digest)
                self._admit_joiner(flight)
                return None, flight, False
            # A reply-cache hit for a new id becomes that id's answer; it takes no capacity.
            hit = self.response_cache.get(request_id, query) if self.response_cache is not None else None
            if hit is not None:
                self.completed.put(request_id, (digest, hit))
                return hit, None, False
            if len(self._in_flight) >= self.max_in_flight:
                self._rejected += 1
                raise Overloaded(f"the gateway is at capacity ({self.max_in_flight} requests in flight)",
                                 retry_after_s=self._retry_after_s())
            flight = self._in_flight[request_id] = Flight(Future(), digest, started)
            return None, flight, True

    def _join(self, flight: Flight, deadline: float) -> dict:
        try:
            return flight.future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise RequestTimeout("request timed out") from None
        finally:
            with self._lock:
                flight.joiners -= 1
                self._joining -= 1

    def answer(self, request_id: str, query: str, timeout_s: float) -> dict:
        started = time.monotonic()
        deadline = started + timeout_s
        digest = query_digest(query)
        cached, flight, owner = self._claim(request_id, query, digest, started)
        if cached is not None:
            return cached
        if not owner:  # the same id and query are already being computed: join it
            return self._join(flight, deadline)
        try:
            reply = self._compute(request_id, query, deadline)
        except BaseException as exc:
            with self._lock:
                self._in_flight.pop(request_id, None)
            flight.future.set_exception(exc)
            raise
        with self._lock:
            self._in_flight.pop(request_id, None)
            self._remember(request_id, digest, reply, started)
        flight.future.set_result(reply)
        return reply

    # ------------------------------------------------------------------ health

    def _probe_loop(self, interval_s: float) -> None:
        while True:
            for target in list(self.targets):
                try:
                    ok = bool(target.probe())
                except Exception:  # a probe must never kill the prober
                    ok = False
                if ok != target.up:
                    self._mark(target, ok, "health probe")
            if self._stop.wait(interval_s):
                return

    def status(self) -> list[dict]:
        with self._lock:
            return [{"node": t.node, "up": t.up, "local": t.local, "forwarded": t.forwarded,
                     "failures": t.failures} for t in self.targets]

    def stats(self) -> dict:
        completed = self.completed.stats()
        with self._lock:
            return {"in_flight": len(self._in_flight), "max_in_flight": self.max_in_flight,
                    "cached": completed.entries, "cache_hits": completed.hits, "joined": self._joined,
                    "joining": self._joining, "max_joiners": self.max_joiners,
                    "max_joiners_per_id": self.max_joiners_per_id, "rejected": self._rejected,
                    "rejected_joiners": self._rejected_joiners, "conflicts": self._conflicts}

    def close(self) -> None:
        self._stop.set()


def remote_target(node: int, client: WorkerClient) -> Target:
    # Out of the rotation until the first probe finds it ready: never route to a starting node.
    return Target(node=node, answer=client.answer, probe=lambda: client.health() is not None, up=False)
