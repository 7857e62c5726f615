"""Node 0's gateway: round robin over the workers, skipping any that is not ready.

Its own worker is called in-process (no HTTP hop to itself); node 1 over HTTP.
A forward that fails because the worker cannot be reached, is not ready or
is full is served by the next worker, and a worker that failed leaves the
rotation until a background probe sees it healthy again.

Every request gets exactly one answer, and each request_id is computed once:
the same id in flight joins the computation, a recently completed one is
answered from a bounded cache (failures are not cached: a retry recomputes).
Only distinct computations count against `max_in_flight`; beyond it the
gateway refuses at once (Overloaded -> 503 + Retry-After) instead of queueing.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from services.cache import LruCache
from services.errors import (NodeError, NodeUnreachable, NoWorkerAvailable, Overloaded, RequestTimeout,
                             ServiceClosed, StageFailed, WorkerFailed)
from services.node_client import WorkerClient

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


class Gateway:
    def __init__(self, targets: list[Target], *, health_interval_s: float = 2.0, max_in_flight: int = 96,
                 completed_cache_size: int = 1024, completed_ttl_s: float = 300.0):
        if not targets:
            raise ValueError("the gateway needs at least one worker")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.targets = targets
        self.max_in_flight = max_in_flight
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future] = {}
        # Completed replies by request_id, oldest first; a ttl of 0 keeps none.
        self.completed = LruCache("idempotency", completed_cache_size if completed_ttl_s > 0 else 0,
                                  completed_ttl_s, refresh_on_read=False)
        self._latency_ema_s = 0.0  # of successful computations, for the Retry-After hint
        self._rejected = 0
        self._joined = 0
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
        if changed:
            log.warning("worker node %d %s%s", target.node, "rejoins the rotation" if up else "leaves the rotation",
                        f": {why}" if why else "")

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
                if exc.status >= 500:  # it failed this request; the probe decides when it is back
                    self._mark(target, False, f"HTTP {exc.status}: {exc.message}")
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

    # ------------------------------------------------------------------ idempotency and capacity

    def _cached(self, request_id: str) -> dict | None:
        """A recently completed reply for this id; expired entries are dropped on the way."""
        self.completed.purge_expired()
        return self.completed.get(request_id)

    def _remember(self, request_id: str, reply: dict, started: float) -> None:
        """Cache a successful reply (never a failure); lock held."""
        now = time.monotonic()
        self._latency_ema_s = 0.8 * self._latency_ema_s + 0.2 * (now - started) if self._latency_ema_s \
            else now - started
        self.completed.put(request_id, reply)

    def _retry_after_s(self) -> float:
        # With every slot busy, one frees about every (mean latency / slots) seconds.
        estimate = self._latency_ema_s / self.max_in_flight
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def answer(self, request_id: str, query: str, timeout_s: float) -> dict:
        started = time.monotonic()
        deadline = started + timeout_s
        with self._lock:
            cached = self._cached(request_id)
            if cached is not None:
                return cached
            future = self._in_flight.get(request_id)
            owner = future is None
            if owner:
                if len(self._in_flight) >= self.max_in_flight:
                    self._rejected += 1
                    raise Overloaded(f"the gateway is at capacity ({self.max_in_flight} requests in flight)",
                                     retry_after_s=self._retry_after_s())
                future = self._in_flight[request_id] = Future()
            else:
                self._joined += 1
        if not owner:  # the same id is already being computed: join it
            try:
                return future.result(timeout=max(0.0, deadline - started))
            except TimeoutError:
                raise RequestTimeout("request timed out") from None
        try:
            reply = self._forward(request_id, query, deadline)
        except BaseException as exc:
            with self._lock:
                self._in_flight.pop(request_id, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._in_flight.pop(request_id, None)
            self._remember(request_id, reply, started)
        future.set_result(reply)
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
                    "rejected": self._rejected}

    def close(self) -> None:
        self._stop.set()


def remote_target(node: int, client: WorkerClient) -> Target:
    # Out of the rotation until the first probe finds it ready: never route to a starting node.
    return Target(node=node, answer=client.answer, probe=lambda: client.health() is not None, up=False)
