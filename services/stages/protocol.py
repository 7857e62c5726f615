"""The face every stage service (BatchingService, ContinuousGenerationService) shows the worker,
/health and the metrics: submit, close, abort, failure, stats."""
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
        """Refuse new items and fail every held one, queued or running, with ServiceClosed; at once."""
        ...

    @property
    def failure(self) -> str | None:
        """Why its thread died (submit then raises StageDown); None while it serves."""
        ...

    def stats(self) -> StageStats: ...
