"""The gateway's routing: round robin over the workers in the rotation, with failover.

A forward that fails because the worker cannot be reached, is not ready or is full
is served by the next worker; a worker that could not be reached, refused our
cluster token or answered 503 leaves the rotation until a health probe sees it
ready again (services.roles.gateway.probing). A request a worker failed (a 500) is
that request's error alone: the worker stays in the rotation. The node client
(services.cluster.clients) says what happened by the error's type.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pipeline.sampling_params import Sampling
from services.cluster.clients import WorkerClient
from services.server.errors import (
    NodeUnreachable,
    NoWorkerAvailable,
    Overloaded,
    PeerError,
    PeerRejectedToken,
    PeerShardUnavailable,
    PeerTimedOut,
    PeerUnavailable,
    RequestTimeout,
    ServiceClosed,
    ShardUnavailable,
    StageFailed,
    WorkerFailed,
)
from services.server.stream_response import started

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class WorkerTarget:
    """One worker the gateway can send a request to, and what it did with them."""
    node: int
    answer: Callable[[str, str, float, int | None], dict]  # (request_id, query, timeout_s, max_new_tokens) -> reply
    # (request_id, query, timeout_s, max_new_tokens, sampling) -> the answer stream: text pieces, then the reply
    stream: Callable[[str, str, float, int | None, Sampling | None], Iterator[str | dict]]
    probe: Callable[[], bool]  # is it ready to serve?
    # Answer every call waiting on it now with make_error() (the node is past its grace period).
    abort: Callable[[Callable[[], BaseException]], None] = lambda make_error: None
    local: bool = False
    up: bool = True  # in the rotation
    forwarded: int = 0
    failures: int = 0  # times it left the rotation


def remote_target(node: int, client: WorkerClient) -> WorkerTarget:
    # Out of the rotation until the first probe finds it ready: never route to a starting node.
    return WorkerTarget(node=node, answer=client.answer, stream=client.stream,
                        probe=lambda: client.health() is not None, abort=client.abort, up=False)


class Router:
    """Sends each request to one worker, the next in turn among those up, and fails over."""

    def __init__(self, targets: list[WorkerTarget]):
        if not targets:
            raise ValueError("the gateway needs at least one worker")
        self.targets = targets
        self._turn = itertools.count()
        self._lock = threading.Lock()  # the targets' fields and the turn
        self._abandoned: Callable[[], BaseException] | None = None

    def rotation(self) -> list[WorkerTarget]:
        """The workers in round-robin order from the next turn, ready ones only."""
        with self._lock:
            start = next(self._turn)
            order = [self.targets[(start + i) % len(self.targets)] for i in range(len(self.targets))]
            return [t for t in order if t.up]

    def mark(self, target: WorkerTarget, up: bool, why: str = "") -> None:
        """Put a worker into the rotation or take it out (counted as a failure)."""
        with self._lock:
            changed = target.up != up
            target.up = up
            if not up:
                target.failures += 1
        if changed:  # rejoining is the normal end of a start or restart; leaving is worth a look
            log.log(logging.INFO if up else logging.WARNING, "worker node %d %s%s", target.node,
                    "rejoins the rotation" if up else "leaves the rotation", f": {why}" if why else "")

    def forward(self, request_id: str, query: str, deadline: float, max_new_tokens: int | None = None) -> dict:
        """The reply of the first worker in turn that takes the request, by `deadline` (monotonic)."""
        reply, target = self._route(deadline, lambda target, remaining: target.answer(request_id, query, remaining,
                                                                                      max_new_tokens))
        reply.setdefault("served_by", target.node)
        return reply

    def forward_stream(self, request_id: str, query: str, deadline: float,
                       max_new_tokens: int | None = None, sampling: Sampling | None = None) -> Iterator[str | dict]:
        """The answer stream of the first worker in turn that takes the request: a worker that fails
        before its first event is failed over as forward() does; an error after it ends the stream."""
        def open_stream(target: WorkerTarget, remaining: float) -> Iterator[str | dict]:
            return started(target.stream(request_id, query, remaining, max_new_tokens, sampling))

        events, target = self._route(deadline, open_stream)
        for event in events:
            if isinstance(event, dict):
                event.setdefault("served_by", target.node)
            yield event

    def _route(self, deadline: float, attempt: Callable[[WorkerTarget, float], T]) -> tuple[T, WorkerTarget]:
        """attempt(worker, time left) on the first worker in turn that takes the request."""
        candidates = self.rotation()
        if not candidates:
            # Everyone looks down: try them all once rather than refuse outright.
            candidates = list(self.targets)
        last_error: Exception | None = None
        for target in candidates:
            if self._abandoned is not None:  # the node is exiting: no failover to another worker
                raise self._abandoned()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeout("request timed out")
            try:
                outcome = attempt(target, remaining)
            except (Overloaded, ServiceClosed) as exc:  # our own worker is full or stopping: try the next
                last_error = exc
                continue
            except NodeUnreachable as exc:  # down: whatever it had started died with it
                self.mark(target, False, str(exc))
                last_error = exc
                continue
            except PeerShardUnavailable as exc:  # the worker is fine, an index shard is not: so would the next be
                raise ShardUnavailable(exc.message) from None
            except PeerUnavailable as exc:  # not ready, stopping or full: nothing computed, try the next
                self.mark(target, False, str(exc))
                last_error = exc
                continue
            except PeerRejectedToken as exc:  # CLUSTER_TOKEN differs between nodes: say so loudly, use the others
                log.error("worker node %d refused our cluster token: set the same CLUSTER_TOKEN on every node",
                          target.node)
                self.mark(target, False, "refused our cluster token")
                last_error = exc
                continue
            except PeerTimedOut as exc:  # its 504, or no answer by the deadline: the work may be in flight
                raise RequestTimeout(exc.message) from None
            except (PeerError, StageFailed) as exc:
                # Any other error (a 500 included) belongs to this request alone: the worker answered,
                # so it stays in the rotation (only unreachability, 401 and 503 take it out).
                raise WorkerFailed(target.node, str(exc)) from None
            except TimeoutError:  # our own worker's RequestTimeout, or any other timeout
                raise RequestTimeout("request timed out") from None
            with self._lock:
                target.forwarded += 1
            return outcome, target
        if self._abandoned is not None:
            raise self._abandoned()
        if isinstance(last_error, Overloaded):
            raise last_error
        raise NoWorkerAvailable(f"no worker could serve the request ({last_error})")

    def abandon(self, make_error: Callable[[], BaseException]) -> None:
        """Answer every forward in progress and every later one with make_error(), at once."""
        self._abandoned = make_error
        for target in self.targets:
            target.abort(make_error)

    def status(self) -> list[dict]:
        """Each worker: whether it is in the rotation, and what it was sent."""
        with self._lock:
            return [{"node": t.node, "up": t.up, "local": t.local, "forwarded": t.forwarded,
                     "failures": t.failures} for t in self.targets]
