"""The face every stage service shows the worker: submit, close, abort, failure, stats.

``BatchingService`` (a batch function behind a queue) and
``ContinuousGenerationService`` (the LLM's continuous batching) both follow it,
so the worker, the node's /health and the metrics treat every stage alike.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable


class StageStats(Protocol):
    """A consistent snapshot of one stage service's counters."""

    @property
    def name(self) -> str: ...

    def summary(self) -> dict:
        """The /health view: at least batches, items, max_batch and queue_depth."""
        ...


@runtime_checkable
class StageService(Protocol):
    @property
    def name(self) -> str: ...

    def submit(self, item: Any) -> Future:
        """Queue one item; a Future for its result. Raises Overloaded or ServiceClosed."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting work, finish or fail what is held, stop the thread."""
        ...

    def abort(self, reason: str) -> None:
        """Stop now, without waiting: refuse new items and fail every item it holds, queued or
        running, with ServiceClosed (a node past its SHUTDOWN_GRACE_S). Returns at once."""
        ...

    @property
    def failure(self) -> str | None:
        """None while its thread serves; why it died once it has (submit then raises StageDown,
        what it held has failed, and the node's /health says unhealthy)."""
        ...

    def stats(self) -> StageStats: ...
