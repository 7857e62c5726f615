"""The gateway's routing: round robin over the workers in the rotation, with failover, and the
health probes that move workers into it and out of it.

A forward the worker could not take (unreachable, not ready, full) goes to the next worker until
the caller has read a piece of its answer; a worker unreachable, refusing our cluster token or
answering 503 leaves the rotation until a health probe sees it ready. A request a worker failed
(a 500) is that request's error alone: the worker stays.

The workers are a membership's members (services.cluster.membership: the NODE_<n>_IP list, or a DNS
name), kept in the router by MemberTargets: one that appears joins out of the rotation until its
probe finds it ready; one that vanishes is routed nothing more, and its client closes once its last
forward has ended.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.cluster.clients import WorkerClient
from services.cluster.membership import Member
from services.server import completion
from services.server.answer import AnswerStream, FinalAnswer, from_relay
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
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
from services.server.stream_response import close

log = logging.getLogger(__name__)


@dataclass
class WorkerTarget:
    """One worker the gateway can send a request to, and what it did with them."""
    node: int | str  # its member name: its node number, or the address it was discovered at
    answer: Callable[[AnswerRequest, Deadline], AnswerStream]  # (request, deadline) -> its answer stream
    probe: Callable[[], bool]  # is it ready to serve?
    # Answer every call waiting on it now with make_error() (the node is past its grace period).
    abort: Callable[[Callable[[], BaseException]], None] = lambda make_error: None
    close: Callable[[], None] = lambda: None  # once it has left and its last forward ended
    local: bool = False
    up: bool = True  # in the rotation
    forwarded: int = 0  # requests it answered
    failures: int = 0  # times it left the rotation
    forwarding: int = 0  # forwards in progress
    gone: bool = False  # left the membership: never routed to again
    # What decides its replies' bits (services.roles.worker: WorkerRole.numerics), as its last probe said
    # (set at creation for the local worker), and where it differs from the local worker's.
    numerics: dict[str, Any] | None = None
    differs: dict[str, dict[str, Any]] = field(default_factory=dict)


def remote_target(node: int | str, client: WorkerClient) -> WorkerTarget:
    # Out of the rotation until the first probe finds it ready: never route to a starting node.
    # The other node is sent the time left: its clock is not ours.
    target = WorkerTarget(node=node, answer=lambda request, deadline: client.answer(request, deadline.left()),
                          probe=lambda: False, abort=client.abort, up=False)

    def probe() -> bool:
        """Ready when its /health says so; what it says of its numerics is kept."""
        body = client.health()
        if body is not None:
            target.numerics = body.get("numerics")
        return body is not None

    target.probe = probe
    return target


def numerics_differences(here: Mapping[str, Any], there: Mapping[str, Any], prefix: str = "") -> dict[str, dict]:
    """Where two workers' numerics differ: {"stages.generate": {"here": ..., "there": ...}, ...}, a nested
    mapping's keys joined by dots; a key one side lacks counts as a difference (value None there)."""
    found: dict[str, dict] = {}
    for key in sorted(set(here) | set(there)):
        a, b = here.get(key), there.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            found.update(numerics_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            found[f"{prefix}{key}"] = {"here": a, "there": b}
    return found


class Router:
    """Sends each request to one worker, the next in turn among those up, and fails over."""

    def __init__(self, targets: list[WorkerTarget]):
        # Empty until the membership names a worker: a 503 meanwhile.
        self.targets = list(targets)  # replaced, never changed in place: readers may hold the old list
        self._turn = itertools.count()
        self._lock = threading.Lock()  # the targets' fields and the turn
        self._aborted: Callable[[], BaseException] | None = None

    def rotation(self) -> list[WorkerTarget]:
        """The workers in round-robin order from the next turn, ready ones only."""
        with self._lock:
            start = next(self._turn)
            order = [self.targets[(start + i) % len(self.targets)] for i in range(len(self.targets))]
            return [t for t in order if t.up]

    def mark(self, target: WorkerTarget, up: bool, why: str = "") -> None:
        """Put a worker into the rotation or take it out (counted as a failure)."""
        with self._lock:
            if target.gone:
                return
            changed = target.up != up
            target.up = up
            if not up:
                target.failures += 1
        if changed:  # rejoining is the normal end of a start or restart; leaving is worth a look
            log.log(logging.INFO if up else logging.WARNING, "worker node %s %s%s", target.node,
                    "rejoins the rotation" if up else "leaves the rotation", f": {why}" if why else "")

    def join(self, target: WorkerTarget) -> None:
        """A worker that appeared: in the list (its `up` says whether in the rotation yet)."""
        with self._lock:
            self.targets = [*self.targets, target]
        if self._aborted is not None:
            target.abort(self._aborted)
        log.info("worker %s joins (%s)", target.node, "ready" if target.up else "until its probe finds it ready")

    def leave(self, target: WorkerTarget) -> None:
        """A worker that vanished: routed nothing more; the forwards it has answer as they would."""
        with self._lock:
            self.targets = [t for t in self.targets if t is not target]
            target.gone, target.up = True, False
            idle = target.forwarding == 0
        log.info("worker %s leaves", target.node)
        if idle:
            target.close()

    def forward(self, request: AnswerRequest, deadline: Deadline) -> AnswerStream:
        """The answer stream of the first worker in turn that takes the request by `deadline`, failing
        over unless the caller has read pieces of the answer already. Each worker's events are read as
        the one answer type (services/server/answer.py); the stage times of the final answer it computed
        for this request go to the completion line."""
        candidates = self.rotation() or list(self.targets)  # everyone looks down: try them all once
        if not candidates:
            raise NoWorkerAvailable("no worker is known yet")
        last_error: Exception | None = None
        for target in candidates:
            if self._aborted is not None:  # the node is exiting: no failover to another worker
                raise self._aborted()
            if deadline.passed:
                raise RequestTimeout("request timed out")
            shown = False  # pieces of this worker's answer the caller has read
            if not self._start_forward(target):
                continue
            try:
                events = target.answer(request, deadline)
                try:
                    for relayed in events:
                        event = from_relay(relayed)
                        if isinstance(event, FinalAnswer):
                            completion.note_stages(dict(event.stages_ms))
                            with self._lock:
                                target.forwarded += 1
                        shown = request.stream
                        yield event
                finally:
                    close(events)
                return
            except Exception as exc:  # noqa: BLE001 - _next_or_raise raises what is not ours to retry
                last_error = self._next_or_raise(target, exc, retry=not shown)
            finally:
                self._end_forward(target)
        if self._aborted is not None:
            raise self._aborted()
        if isinstance(last_error, Overloaded):
            raise last_error
        raise NoWorkerAvailable(f"no worker could serve the request ({last_error})")

    def _start_forward(self, target: WorkerTarget) -> bool:
        """Count a forward to `target`; False if it has left meanwhile."""
        with self._lock:
            if target.gone:
                return False
            target.forwarding += 1
            return True

    def _end_forward(self, target: WorkerTarget) -> None:
        with self._lock:
            target.forwarding -= 1
            last = target.gone and target.forwarding == 0
        if last:
            target.close()

    def _next_or_raise(self, target: WorkerTarget, exc: Exception, *, retry: bool) -> Exception:
        """The error to remember while the next worker is tried (`retry`: nobody read any of the
        answer), or the request's own error, raised."""
        why: str | None = str(exc)  # why the worker leaves the rotation; None: it stays
        if isinstance(exc, (Overloaded, ServiceClosed)):  # our own worker is full or stopping
            why = None
        elif isinstance(exc, NodeUnreachable):  # down: whatever it had started died with it
            pass
        elif isinstance(exc, PeerShardUnavailable):  # the worker is fine, an index shard is not: so would the next be
            raise ShardUnavailable(exc.message) from None
        elif isinstance(exc, PeerUnavailable):  # not ready, stopping or full: nothing computed
            pass
        elif isinstance(exc, PeerRejectedToken):  # CLUSTER_TOKEN differs between nodes: say so loudly, use the others
            log.error("worker node %s refused our cluster token: set the same CLUSTER_TOKEN on every node",
                      target.node)
            why = "refused our cluster token"
        elif isinstance(exc, PeerTimedOut):  # its 504, or no answer by the deadline: the work may be in flight
            raise RequestTimeout(exc.message) from None
        elif isinstance(exc, (PeerError, StageFailed)):  # this request's alone: the worker stays
            raise WorkerFailed(target.node, str(exc)) from None
        elif isinstance(exc, TimeoutError):  # our own worker's RequestTimeout, or any other timeout
            raise RequestTimeout("request timed out") from None
        else:
            raise exc
        if why is not None:
            self.mark(target, False, why)
        if not retry:
            raise exc
        return exc

    def abort(self, make_error: Callable[[], BaseException]) -> None:
        """Answer every forward in progress and every later one with make_error(), at once."""
        self._aborted = make_error
        for target in self.targets:
            target.abort(make_error)

    def probe_once(self) -> None:
        """Ask each worker whether it is ready; move those whose answer differs from their place."""
        for target in self.targets:
            self.probe(target)

    def probe(self, target: WorkerTarget) -> None:
        """Ask one worker whether it is ready; move it if its answer differs from its place. A worker whose
        numerics differ from the local worker's stays in the rotation (a GPU worker beside CPU ones is a
        deployment's choice) but is named in a warning and in status(): a request's reply then depends on
        the worker it is routed to."""
        try:
            ok = bool(target.probe())
        except Exception:  # a probe must never kill the prober
            ok = False
        if ok != target.up:
            self.mark(target, ok, "health probe")
        if ok:
            self._compare_numerics(target)

    def _compare_numerics(self, target: WorkerTarget) -> None:
        local = next((t for t in self.targets if t.local), None)
        if target.local or local is None or local.numerics is None or target.numerics is None:
            return
        differs = numerics_differences(local.numerics, target.numerics)
        with self._lock:
            changed, target.differs = differs != target.differs, differs
        if changed and differs:
            log.warning("worker node %s computes with other numerics than this node (%s): a request's reply "
                        "can differ with the worker it is routed to", target.node,
                        "; ".join(f"{key}: here {d['here']}, there {d['there']}" for key, d in differs.items()))

    def status(self) -> list[dict]:
        """Each worker: whether it is in the rotation, and what it was sent."""
        with self._lock:
            return [{"node": t.node, "up": t.up, "local": t.local, "forwarded": t.forwarded,
                     "failures": t.failures, "numerics_differ": dict(t.differs)} for t in self.targets]


class MemberTargets:
    """Keeps the router's workers equal to a membership's members (subscribed as on_change): each new
    member a target (make_target) that joins, is probed at once and serves when ready; each member
    gone, its target leaves."""

    def __init__(self, router: Router, make_target: Callable[[Member], WorkerTarget]):
        self.router = router
        self.make_target = make_target
        self.by_member: dict[Member, WorkerTarget] = {}

    def on_change(self, members: list[Member]) -> None:
        for member in [m for m in self.by_member if m not in members]:
            self.router.leave(self.by_member.pop(member))
        for member in [m for m in members if m not in self.by_member]:
            target = self.by_member[member] = self.make_target(member)
            self.router.join(target)
            self.router.probe(target)


def remote_worker(member: Member, *, connect_timeout_s: float, token: str) -> WorkerTarget:
    """A worker on another node, named as its member is; its client closes once it has left."""
    client = WorkerClient(member.url, connect_timeout_s=connect_timeout_s, token=token)
    target = remote_target(member.name, client)
    target.close = client.close
    return target
