"""Which stages the requests in flight on a node may still submit to: a batch that every such request
is already in has nobody left to wait for, so it closes at once (services/stages/batch_queue.py).

A request begins with its route, the stages it may enter in their order (an answer's: all of
spec.WORKER_STAGES; /v1/rerank's: rerank alone). Once it has submitted all it will to a stage (a
worker's request: when it first waits on it, services/roles/worker/stage_clock.py; a /search call:
once its vectors are queued) it has *passed* it and every stage before it on its route (stages are
entered in order; one it skipped, an embed cache hit, is behind it too); ending, by its answer, an
error or a deadline, passes the rest.
Stages are keyed by name (a Stage is its own name): a stage service watches its own name.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence


class Upstream:
    """Thread-safe. Its lock is a leaf: nothing is called while it is held, so a batch queue may read
    ``may_join`` under its own lock; the wakes of stages whose count fell to none come after it is
    released (a wake takes that queue's lock: calling it here would order the two locks both ways)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()  # by stage: requests that may still submit to it
        self._wakes: dict[str, list[Callable[[], None]]] = {}

    def begin(self, stages: Sequence[str]) -> Route:
        """A request that may submit to `stages`, in this order, from now until it passes or ends them."""
        route = Route(self, tuple(stages))
        with self._lock:
            self._counts.update(route.ahead)
        return route

    def may_join(self, stage: str) -> int:
        """How many requests in flight may still submit to `stage` (those already in it are not counted)."""
        with self._lock:
            return self._counts[stage]

    def watch(self, stage: str, wake: Callable[[], None]) -> None:
        """Call `wake` (with no lock held) whenever `stage`'s count falls to none."""
        with self._lock:
            self._wakes.setdefault(stage, []).append(wake)

    def unwatch(self, stage: str, wake: Callable[[], None]) -> None:
        """Stop calling `wake` (a closed service; a second call is a no-op)."""
        with self._lock:
            wakes = self._wakes.get(stage, [])
            if wake in wakes:
                wakes.remove(wake)

    def _pass(self, route: Route, stages: Sequence[str] | None) -> None:
        """`route` passes the furthest of `stages` ahead of it and every stage before it (None: all)."""
        with self._lock:
            ahead = route.ahead
            through = len(ahead) if stages is None else \
                max((ahead.index(stage) + 1 for stage in stages if stage in ahead), default=0)
            left, route.ahead = ahead[:through], ahead[through:]
            emptied: list[Callable[[], None]] = []
            for stage in left:
                self._counts[stage] -= 1
                if self._counts[stage] == 0:
                    del self._counts[stage]
                    emptied.extend(self._wakes.get(stage, ()))
        for wake in emptied:
            wake()


class Route:
    """One request's stages still ahead of it (Upstream.begin); a context manager that ends it."""

    def __init__(self, upstream: Upstream, stages: tuple[str, ...]):
        self._upstream = upstream
        self.ahead = stages  # changed only under the upstream's lock

    def passed(self, *stages: str) -> None:
        """The request has submitted what it will to `stages`: it no longer counts for them, nor for
        any stage before the furthest of them on its route. A stage already behind it changes nothing."""
        self._upstream._pass(self, stages)

    def end(self) -> None:
        """The request is over here: it counts for no stage (again: a no-op)."""
        self._upstream._pass(self, None)

    def __enter__(self) -> Route:
        return self

    def __exit__(self, *exc_info) -> None:
        self.end()
