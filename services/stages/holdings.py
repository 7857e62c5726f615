"""The futures a stage service has taken off its queue and not yet answered (a batch inside
``batch_fn``, the continuous engine's sequences), and the three ways both services end them early:
``fail_held`` (a failed iteration), ``abort`` (the node's grace is over) and ``die`` (the stage's
thread ends on an error: StageDown from now on). None waits on the stage's thread, which may be
in a model call: its late result finds the future resolved and is dropped.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from services.server.errors import ServiceClosed, StageDown
from services.stages.batch_queue import BatchQueue
from services.stages.futures import Claim, fail

logger = logging.getLogger(__name__)


class Holdings:
    """Thread-safe: the stage's thread holds and releases; ``abort`` comes from the node's drain thread."""

    def __init__(self, queue: BatchQueue, owner: str):
        self._queue = queue
        self._owner = owner
        self._lock = threading.Lock()
        self._futures: set[Future] = set()

    def hold(self, futures: Iterable[Future]) -> None:
        with self._lock:
            self._futures.update(futures)

    def release(self, futures: Iterable[Future]) -> None:
        with self._lock:
            self._futures.difference_update(futures)

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)

    def fail_held(self, make_error: Callable[[], BaseException]) -> None:
        """Answer every held future not yet answered with a new error each; release them all."""
        with self._lock:
            held, self._futures = list(self._futures), set()
        outcomes = [fail(future, make_error(), self._owner) for future in held]
        self._queue.record(failed_items_total=outcomes.count(Claim.RUN))

    def abort(self, reason: str) -> None:
        """Refuse new items and fail every item held or queued with ServiceClosed, at once."""
        self._queue.close()
        self.fail_held(lambda: ServiceClosed(f"{self._owner} stopped: {reason}"))
        self._queue.fail_queued(reason)

    def die(self, exc: BaseException) -> None:
        """The stage's thread ends on `exc`: StageDown for every held, queued and later item."""
        reason = f"{type(exc).__name__}: {exc}"
        logger.critical("%s: its thread died (%s); failing what it holds, the node reports unhealthy",
                        self._owner, reason, exc_info=exc)
        self._queue.mark_down(reason)

        def down() -> StageDown:
            error = StageDown(self._queue.name, reason)
            error.__cause__ = exc
            return error

        self.fail_held(down)
        self._queue.fail_queued(reason, cause=exc)
