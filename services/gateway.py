"""Node 0's gateway: round robin over the workers, skipping any that is not ready.

Its own worker is called in-process (no HTTP hop to itself); node 1 over HTTP.
A forward that fails because the worker cannot be reached is served by the
next worker, and the failed one leaves the rotation until a background probe
sees it healthy again. The same request_id in flight is computed once.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from services.batching import Overloaded
from services.node_client import NodeError, NodeUnreachable, WorkerClient
from services.worker import RequestTimeout

log = logging.getLogger(__name__)


class NoWorkerAvailable(RuntimeError):
    pass


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
    def __init__(self, targets: list[Target], *, health_interval_s: float = 2.0,
                 completed_cache_size: int = 1024, completed_ttl_s: float = 300.0):
        if not targets:
            raise ValueError("the gateway needs at least one worker")
        self.targets = targets
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future] = {}
        self._completed: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._completed_cache_size = completed_cache_size
        self._completed_ttl_s = completed_ttl_s
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
            except Overloaded as exc:  # our own worker is full: the next one may not be
                last_error = exc
                continue
            except NodeUnreachable as exc:
                self._mark(target, False, str(exc))
                last_error = exc
                continue  # nothing was computed there: another worker serves it
            except NodeError as exc:
                if exc.status == 503:  # starting, stopping or overloaded: try the next one
                    last_error = exc
                    continue
                if exc.status == 504:
                    raise RequestTimeout(exc.message) from None
                raise
            except TimeoutError:
                raise RequestTimeout("request timed out") from None
            with self._lock:
                target.forwarded += 1
            reply.setdefault("served_by", target.node)
            return reply
        if isinstance(last_error, Overloaded):
            raise last_error
        raise NoWorkerAvailable(f"no worker could serve the request ({last_error})")

    # ------------------------------------------------------------------ idempotency

    def answer(self, request_id: str, query: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            cached = self._completed.get(request_id)
            if cached and time.monotonic() - cached[0] < self._completed_ttl_s:
                return cached[1]
            future = self._in_flight.get(request_id)
            owner = future is None
            if owner:
                future = self._in_flight[request_id] = Future()
        if not owner:  # the same id is already being computed: join it
            try:
                return future.result(timeout=max(0.0, deadline - time.monotonic()))
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
            self._completed[request_id] = (time.monotonic(), reply)
            self._completed.move_to_end(request_id)
            while len(self._completed) > self._completed_cache_size:
                self._completed.popitem(last=False)
        future.set_result(reply)
        return reply

    # ------------------------------------------------------------------ health

    def _probe_loop(self, interval_s: float) -> None:
        while True:
            for target in list(self.targets):
                try:
                    ok = target.probe()
                except Exception:  # a probe must never kill the prober
                    ok = False
                if ok != target.up:
                    self._mark(target, ok, "health probe")
            if self._stop.wait(interval_s):
                return

    def status(self) -> list[dict]:
        with self._lock:
            return [{"node": t.node, "up": t.up, "local": t.local, "forwarded": t.forwarded} for t in self.targets]

    def close(self) -> None:
        self._stop.set()


def remote_target(node: int, client: WorkerClient) -> Target:
    return Target(node=node, answer=client.answer, probe=lambda: client.health() is not None)
