"""What a stage service holds, and the one way a stage stops with work in hand.

A stage's callers wait on futures in two places: still in its ``BatchQueue``, or
taken off it and not yet answered (a batch inside ``batch_fn``; a sequence in the
continuous engine). ``Holdings`` tracks the second place and gives both stage
services the same three ways to end what they hold early:

- ``fail_held``: answer every held item with an error (a failed iteration);
- ``abort``: the node's grace period is over: refuse new items, fail everything now;
- ``die``: the stage's thread is ending on an error: refuse new items with
  ``StageDown`` from now on and fail everything now (the node reports unhealthy).

Failing a future never waits on the stage's thread, which may be inside a model
call that cannot be interrupted: its late result finds the future resolved and is
dropped (``services.stages.futures``).
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
    """The futures a stage service has taken off its queue and not yet answered.

    Thread-safe: the stage's thread holds and releases; ``abort`` comes from the
    node's drain thread.
    """

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
