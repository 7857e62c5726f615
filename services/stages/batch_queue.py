"""A stage's pending items and when a batch closes: at ``max_size`` items, ``max_wait_ms`` after
its oldest item arrived, at once when closing, or at once when no request that may still submit
to the stage is left outside it (``may_join``). Items are taken in arrival order. The policy
(``due_in``, ``take``) reads an injectable clock, so it is tested with no thread and no sleep.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any

from services.server.errors import Overloaded, ServiceClosed, StageDown
from services.stages.batch_stats import BatchCounters, BatchingStats
from services.stages.futures import Claim, claim, end_with_exception, peek

logger = logging.getLogger(__name__)

# Bounds of Overloaded's Retry-After hint: no hammering of a full queue, and no minutes-long
# hint from one very slow batch.
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 60.0


@dataclass
class PendingItem:
    item: Any
    future: Future
    enqueued_at: float  # the queue's clock at submit


def validate_positive_int(name: str, value: Any) -> int:
    # bool is an int subclass; max_size=True is certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def validate_max_wait_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"max_wait_ms must be a number >= 0, got {value!r}")
    # inf would let a lone request wait forever; nan compares false to everything.
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"max_wait_ms must be a finite number >= 0, got {value!r}")
    return float(value)


class BatchQueue:
    """One lock guards the items, the closing flag and the counters (so snapshots are consistent);
    it is never held while user code runs: a done-callback calling ``put()`` would deadlock.

    ``may_join()``: how many requests may still submit to this stage beyond those queued (None: not
    known, every batch waits out its window). It is called under this lock, so it may take only a
    lock that is never held while calling into a queue (services.stages.upstream's: a leaf); whoever
    lowers it calls ``wake()`` after releasing its own lock."""

    def __init__(self, name: str, *, max_size: int, max_wait_ms: float, max_queue: int,
                 clock: Callable[[], float] = time.monotonic, may_join: Callable[[], int] | None = None):
        self.name = name
        self.max_size = validate_positive_int("max_size", max_size)
        self.max_wait_ms = validate_max_wait_ms(max_wait_ms)
        self.max_queue = validate_positive_int("max_queue", max_queue)
        self._max_wait_s = self.max_wait_ms / 1000.0
        self._clock = clock
        self._may_join = may_join
        self._cond = threading.Condition(threading.Lock())
        # By future: a cancelled item leaves in O(1); the first entry, the oldest, sets the deadline.
        self._pending: OrderedDict[Future, PendingItem] = OrderedDict()
        self._closing = False
        self._failure: str | None = None  # why the owner's thread died (mark_down)
        self._counters = BatchCounters()

    # ------------------------------------------------------------ submitting

    def put(self, items: list, *, busy: int = 0,
            retry_after_s: Callable[[int], float] | None = None) -> list[Future]:
        """A Future for each item, all queued or none. ``busy``: work the owner holds outside the
        queue, counted against ``max_queue``; ``retry_after_s(depth)`` overrides Overloaded's hint."""
        now = self._clock()
        records = []
        for item in items:
            future: Future = Future()
            # Registered while PENDING and unseen by the worker: it cannot fire here.
            future.add_done_callback(self._forget_if_cancelled)
            records.append(PendingItem(item, future, now))
        with self._cond:
            if self._failure is not None:
                raise StageDown(self.name, self._failure)
            if self._closing:
                raise ServiceClosed(f"stage service {self.name!r} is closed")
            depth = len(self._pending)
            if depth + busy + len(records) > self.max_queue:
                hint = retry_after_s(depth) if retry_after_s else self._retry_after_locked(depth)
                raise Overloaded(f"stage service {self.name!r} is overloaded: {depth + busy} items held, "
                                 f"capacity max_queue={self.max_queue}", retry_after_s=hint)
            for record in records:
                self._pending[record.future] = record
            # Wake the worker only when its deadline changes: a window starts or a batch is full.
            if depth == 0 or depth < self.max_size <= depth + len(records):
                self._cond.notify()
        return [record.future for record in records]

    def _retry_after_locked(self, depth: int) -> float:
        # The queue's drain time at the average batch time (before any batch: one window).
        counters = self._counters
        per_batch = counters.run_seconds_sum / counters.batches_total if counters.batches_total else self._max_wait_s
        estimate = math.ceil(depth / self.max_size) * per_batch
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def _forget_if_cancelled(self, future: Future) -> None:
        """Drop a cancelled item at once, so it holds no queue slot and sets no deadline."""
        if not future.cancelled():
            return
        with self._cond:
            if self._pending.pop(future, None) is None:
                return  # already taken: the taker sees the cancellation
            # CANCELLED -> CANCELLED_AND_NOTIFIED, or concurrent.futures.wait() would not count it done.
            future.set_running_or_notify_cancel()
            self._counters = self._counters.plus(cancelled_items_total=1)

    # ------------------------------------------------------------ the policy

    def due_in(self) -> float | None:
        """Seconds until the next batch closes: 0 now, None while nothing is queued."""
        with self._cond:
            return self._due_in_locked()

    def _due_in_locked(self) -> float | None:
        if not self._pending:
            return None
        if len(self._pending) >= self.max_size or self._closing:
            return 0.0
        if self._may_join is not None and self._may_join() <= 0:
            return 0.0  # nobody else can join: waiting would only delay the ones here
        oldest = next(iter(self._pending.values()))
        return max(0.0, oldest.enqueued_at + self._max_wait_s - self._clock())

    def take(self, limit: int | None = None, *, start_running: bool = True) -> list[PendingItem]:
        """Up to ``limit`` (max_size) live items now, as one batch. ``start_running=False`` leaves their
        futures PENDING, for callers that may cancel work in progress (continuous generation)."""
        with self._cond:
            return self._take_locked(self.max_size if limit is None else limit, start_running)

    def _take_locked(self, limit: int, start_running: bool = True) -> list[PendingItem]:
        batch: list[PendingItem] = []
        owner = f"stage service {self.name!r}"
        while self._pending and len(batch) < limit:
            _, pending = self._pending.popitem(last=False)
            # PENDING -> RUNNING; a caller who cancelled first is skipped here.
            outcome = claim(pending.future, owner) if start_running else peek(pending.future, owner)
            if outcome is Claim.RUN:
                batch.append(pending)
            elif outcome is Claim.CANCELLED:
                self._counters = self._counters.plus(cancelled_items_total=1)
        if batch:
            now = self._clock()
            self._counters = self._counters.with_batch([now - p.enqueued_at for p in batch])
        return batch

    def next_batch(self) -> list[PendingItem] | None:
        """Block until a batch is due and take it; None once closing and drained (the worker's call)."""
        with self._cond:
            while True:
                wait = self._due_in_locked()
                if wait is None:
                    if self._closing:
                        return None
                    self._cond.wait()
                elif wait > 0:
                    self._cond.wait(wait)  # then re-check: full now? oldest cancelled? closing?
                else:
                    batch = self._take_locked(self.max_size)
                    if batch:
                        return batch

    def wait_for_items(self) -> bool:
        """Block until something is queued; False once closing with nothing queued."""
        with self._cond:
            while not self._pending and not self._closing:
                self._cond.wait()
            return bool(self._pending)

    def wake(self) -> None:
        """Have the worker look at its deadline again: ``may_join`` fell (a request left or passed by)."""
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------ shutdown

    @property
    def closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Refuse new items and wake the worker: it flushes without waiting for windows."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def mark_down(self, reason: str) -> None:
        """The owner's thread died: refuse new items with StageDown from now on (the first reason stays)."""
        with self._cond:
            self._failure = self._failure or reason
            self._closing = True
            self._cond.notify_all()

    @property
    def failure(self) -> str | None:
        return self._failure

    def _closed_error(self, reason: str) -> ServiceClosed:
        if self._failure is not None:
            return StageDown(self.name, self._failure)
        return ServiceClosed(f"stage service {self.name!r} shut down before this item ran ({reason})")

    def fail_queued(self, reason: str, cause: BaseException | None = None) -> None:
        """The one way items still queued end when their service stops: ServiceClosed, or StageDown
        once marked down (cancelled stay so)."""
        with self._cond:
            queued = list(self._pending.values())
            self._pending.clear()
        if queued:
            logger.warning("stage service %r: %s; failing %d queued items", self.name, reason, len(queued))
        owner = f"stage service {self.name!r}"
        outcomes = []
        for pending in queued:
            error = self._closed_error(reason)
            error.__cause__ = cause
            outcomes.append(end_with_exception(pending.future, error, owner))
        self.record(failed_items_total=outcomes.count(Claim.RUN), cancelled_items_total=outcomes.count(Claim.CANCELLED))

    # ------------------------------------------------------------ counters

    def record(self, **deltas: float) -> None:
        with self._cond:
            self._counters = self._counters.plus(**deltas)

    def __len__(self) -> int:
        return len(self._pending)

    def snapshot(self) -> BatchingStats:
        with self._cond:
            counters = {f.name: getattr(self._counters, f.name) for f in fields(BatchCounters)}
            counters["batch_size_counts"] = dict(self._counters.batch_size_counts)
            return BatchingStats(**counters, name=self.name, max_size=self.max_size,
                                 max_wait_ms=self.max_wait_ms, max_queue=self.max_queue,
                                 queue_depth=len(self._pending))
