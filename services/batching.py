"""Opportunistic request batching on a dedicated worker thread.

A ``BatchingService`` turns many independent ``submit(item)`` calls into calls
of ``batch_fn(list_of_items)`` so that a model (embedder, reranker, generator)
sees batches instead of single items. Each caller gets a
``concurrent.futures.Future`` that resolves to its own result.

Batching is opportunistic: a batch closes as soon as ``max_size`` items are
waiting, or ``max_wait_ms`` after its *oldest* item arrived, whichever comes
first. Under load batches fill up and go at once; with no load a lone request
waits at most ``max_wait_ms``.

The design follows Ray Serve's ``serve.batch`` (``python/ray/serve/batching.py``)
but is synchronous: one daemon thread per service, a ``threading.Condition``
guarding the queue, and no polling.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from services.errors import BatchSizeMismatch, Overloaded, ServiceClosed

logger = logging.getLogger(__name__)

__all__ = [
    "BatchSizeMismatch",
    "BatchingService",
    "BatchingStats",
    "Overloaded",
    "ServiceClosed",
]

# Bounds of the Retry-After hint carried by Overloaded. The lower bound keeps
# clients from hammering a full queue; the upper one keeps a pathological
# average (one very slow batch) from telling clients to go away for minutes.
_MIN_RETRY_AFTER_S = 0.05
_MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True)
class BatchingStats:
    """A consistent snapshot of a service's counters (taken under its lock)."""

    name: str
    max_size: int
    max_wait_ms: float
    max_queue: int
    # Batches taken off the queue and handed to batch_fn. Individual retries
    # after a failed batch are part of that batch, not new batches, so that
    # sum(size * count for size, count in batch_size_counts.items()) == items_total.
    batches_total: int
    # Items that were handed to batch_fn (cancelled items are never counted).
    items_total: int
    # Items whose future got an exception (batch_fn error, BatchSizeMismatch,
    # ServiceClosed at shutdown).
    failed_items_total: int
    # Items cancelled by their caller before their batch ran.
    cancelled_items_total: int
    # Batches whose items were retried one by one after batch_fn raised.
    retried_batches_total: int
    # Items accepted and still waiting for a batch.
    queue_depth: int
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    # Sum over items of the time from submit() to the start of their batch.
    wait_seconds_sum: float = 0.0
    # Sum over batches of the time spent in batch_fn (retries included).
    run_seconds_sum: float = 0.0
    max_batch_size_seen: int = 0


@dataclass
class _PendingItem:
    """One submitted item waiting in the queue."""

    item: Any
    future: Future
    enqueued_at: float  # time.monotonic() at submit


def _validate_positive_int(name: str, value: Any) -> int:
    # bool is an int subclass; max_size=True is certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _validate_max_wait_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"max_wait_ms must be a number >= 0, got {value!r}")
    # inf would let a lone request wait forever; nan compares false to everything.
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"max_wait_ms must be a finite number >= 0, got {value!r}")
    return float(value)


def _traceback(error: BaseException) -> BaseException | None:
    """A deadline that ran out is an outcome, not a bug: one line, no traceback."""
    return None if isinstance(error, TimeoutError) else error


def _brief(error: BaseException) -> str:
    return f": {type(error).__name__}: {error}" if isinstance(error, TimeoutError) else ""


class BatchingService:
    """Groups submitted items into batches for ``batch_fn`` on one worker thread.

    ``batch_fn(items: list) -> list`` must return one result per item, in the
    same order. It is only ever called from the service's worker thread, so it
    needs no locking of its own.
    """

    def __init__(
        self,
        name: str,
        batch_fn: Callable[[list], list],
        *,
        max_size: int,
        max_wait_ms: float,
        max_queue: int = 1024,
        retry_individually: bool = True,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if not callable(batch_fn):
            raise ValueError(f"batch_fn must be callable, got {type(batch_fn).__name__}")
        self._name = name
        self._batch_fn = batch_fn
        self._max_size = _validate_positive_int("max_size", max_size)
        self._max_wait_ms = _validate_max_wait_ms(max_wait_ms)
        self._max_wait_s = self._max_wait_ms / 1000.0
        self._max_queue = _validate_positive_int("max_queue", max_queue)
        self._retry_individually = bool(retry_individually)

        # One lock guards the queue, the closing flag and every counter, so
        # stats() is a consistent snapshot. It is never held while user code
        # runs (batch_fn, future callbacks): a done-callback that calls submit()
        # would otherwise deadlock on this non-reentrant lock.
        self._cond = threading.Condition(threading.Lock())
        # Keyed by the item's future so a cancelled item can be removed in O(1)
        # while insertion order (= arrival order) is kept: the first entry is
        # always the oldest live item, which sets the batch deadline.
        self._pending: OrderedDict[Future, _PendingItem] = OrderedDict()
        self._closing = False

        self._batches_total = 0
        self._items_total = 0
        self._failed_items_total = 0
        self._cancelled_items_total = 0
        self._retried_batches_total = 0
        self._batch_size_counts: dict[int, int] = {}
        self._wait_seconds_sum = 0.0
        self._run_seconds_sum = 0.0
        self._max_batch_size_seen = 0

        # Daemon: a service someone forgot to close must not keep the process alive.
        self._thread = threading.Thread(
            target=self._worker_loop, name=f"batching-{name}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ API

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def max_wait_ms(self) -> float:
        return self._max_wait_ms

    def submit(self, item: Any) -> Future:
        """Queue one item; return a Future for its result at once.

        Raises ``Overloaded`` if ``max_queue`` items are already waiting and
        ``ServiceClosed`` after ``close()``.
        """
        return self._enqueue([item])[0]

    def submit_many(self, items: Iterable[Any]) -> list[Future]:
        """Queue several items atomically: either all are accepted or none.

        A request that needs several sub-items processed must not end up with
        half of them queued and half rejected. The items are queued
        contiguously, so they tend to land in the same batch.

        Raises ``Overloaded`` if they do not all fit now, and ``ValueError``
        if they could never fit (more items than ``max_queue``): retrying that
        would be pointless.
        """
        items = list(items)
        if len(items) > self._max_queue:
            raise ValueError(
                f"batching service {self._name!r}: cannot submit {len(items)} items "
                f"at once, max_queue is {self._max_queue}"
            )
        if not items:
            return []
        return self._enqueue(items)

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting items, finish the queued ones, and stop the worker.

        Waits up to ``timeout`` seconds (forever if None) for the queue to
        drain. Items still queued after that fail with ``ServiceClosed``; a
        batch already inside ``batch_fn`` cannot be interrupted and resolves
        when ``batch_fn`` returns, after which the worker exits. Idempotent:
        a second call waits again for the worker (e.g. ``close()`` without a
        timeout to join it).
        """
        with self._cond:
            if not self._closing:
                self._closing = True
                logger.debug("batching service %r closing", self._name)
            # Wake the worker: it flushes without waiting for a batch window
            # (nothing new can arrive) and exits once the queue is empty.
            self._cond.notify_all()

        if threading.current_thread() is self._thread:
            # close() from inside batch_fn: joining ourselves would deadlock.
            # The loop exits after the current batch once the queue is empty.
            return
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return

        with self._cond:
            abandoned = list(self._pending.values())
            self._pending.clear()
        if abandoned:
            logger.warning(
                "batching service %r: close timed out after %ss; failing %d queued items",
                self._name, timeout, len(abandoned),
            )
        failed = 0
        cancelled = 0
        for pending in abandoned:
            # We removed these from the queue, so we own them; the callers may
            # still have cancelled them meanwhile.
            if not pending.future.set_running_or_notify_cancel():
                cancelled += 1
                continue
            failed += 1
            self._set_exception(
                pending.future,
                ServiceClosed(
                    f"batching service {self._name!r} shut down before this item ran "
                    f"(close timed out after {timeout}s)"
                ),
            )
        with self._cond:
            self._failed_items_total += failed
            self._cancelled_items_total += cancelled

    def stats(self) -> BatchingStats:
        """Return a consistent snapshot of the counters."""
        with self._cond:
            return BatchingStats(
                name=self._name,
                max_size=self._max_size,
                max_wait_ms=self._max_wait_ms,
                max_queue=self._max_queue,
                batches_total=self._batches_total,
                items_total=self._items_total,
                failed_items_total=self._failed_items_total,
                cancelled_items_total=self._cancelled_items_total,
                retried_batches_total=self._retried_batches_total,
                queue_depth=len(self._pending),
                batch_size_counts=dict(self._batch_size_counts),
                wait_seconds_sum=self._wait_seconds_sum,
                run_seconds_sum=self._run_seconds_sum,
                max_batch_size_seen=self._max_batch_size_seen,
            )

    def __enter__(self) -> BatchingService:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"BatchingService(name={self._name!r}, max_size={self._max_size}, "
            f"max_wait_ms={self._max_wait_ms}, max_queue={self._max_queue})"
        )

    # ------------------------------------------------------------ submitting

    def _enqueue(self, items: list) -> list[Future]:
        now = time.monotonic()
        records = []
        for item in items:
            future: Future = Future()
            # Registered before the item is visible to the worker, while the
            # future is still PENDING, so the callback never fires right here.
            future.add_done_callback(self._forget_if_cancelled)
            records.append(_PendingItem(item, future, now))

        with self._cond:
            if self._closing:
                raise ServiceClosed(f"batching service {self._name!r} is closed")
            depth = len(self._pending)
            if depth + len(records) > self._max_queue:
                raise Overloaded(
                    f"batching service {self._name!r} is overloaded: {depth} items "
                    f"queued, capacity max_queue={self._max_queue}",
                    retry_after_s=self._retry_after_locked(depth),
                )
            for record in records:
                self._pending[record.future] = record
            new_depth = depth + len(records)
            # Only wake the worker when it has something new to decide: the
            # queue became non-empty (start the window) or a full batch is now
            # there (stop waiting). Other submits would only cause spurious
            # wake-ups that recompute the same deadline.
            if depth == 0 or depth < self._max_size <= new_depth:
                self._cond.notify()
        return [record.future for record in records]

    def _retry_after_locked(self, depth: int) -> float:
        # Time to drain the current queue at the observed average batch time.
        # Before the first batch there is no average; a window is a fair guess.
        if self._batches_total:
            per_batch = self._run_seconds_sum / self._batches_total
        else:
            per_batch = self._max_wait_s
        estimate = math.ceil(depth / self._max_size) * per_batch
        return min(max(estimate, _MIN_RETRY_AFTER_S), _MAX_RETRY_AFTER_S)

    def _forget_if_cancelled(self, future: Future) -> None:
        """Done-callback of every item's future: drop cancelled items at once.

        Without it a cancelled item would hold a queue slot (and could trigger
        Overloaded) and set the batch deadline until the worker reached it.
        """
        # Runs on every resolution; only cancellation needs work.
        if not future.cancelled():
            return
        with self._cond:
            if self._pending.pop(future, None) is None:
                # The worker (or close) already took it off the queue and
                # will see the cancellation in set_running_or_notify_cancel.
                return
            # CANCELLED -> CANCELLED_AND_NOTIFIED: without this,
            # concurrent.futures.wait() would not count it as done. No user
            # callbacks run here (they ran in cancel()), so the lock is fine.
            future.set_running_or_notify_cancel()
            self._cancelled_items_total += 1

    # ---------------------------------------------------------------- worker

    def _worker_loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                logger.debug("batching service %r worker stopped", self._name)
                return
            try:
                self._run_batch(batch)
            except (KeyboardInterrupt, SystemExit) as exc:
                # batch_fn asked for the thread to stop (sys.exit() in a thread
                # ends that thread). Honour it, but resolve every future first so
                # no caller waits forever, and refuse new work.
                logger.error(
                    "batching service %r: batch_fn raised %s; shutting the service down",
                    self._name, type(exc).__name__,
                )
                self._shut_down_after(batch, exc)
                return
            except BaseException:
                # Only a bug in this module gets here (batch_fn errors are
                # handled in _run_batch). Keep serving; fail what is unresolved.
                logger.exception("batching service %r: internal error in worker", self._name)
                failed = 0
                for pending in batch:
                    if not pending.future.done():
                        failed += 1
                        self._set_exception(
                            pending.future,
                            RuntimeError(f"batching service {self._name!r}: internal error"),
                        )
                with self._cond:
                    self._failed_items_total += failed

    def _next_batch(self) -> list[_PendingItem] | None:
        """Block until a batch is due; return it, or None when closed and drained."""
        with self._cond:
            while True:
                if not self._pending:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                # Go now if a full batch waits (never sleep on one), if closing
                # (nothing new can join, so waiting is pointless), or if the
                # oldest item's window is over. Otherwise sleep until that
                # window ends or submit() notifies us that the batch is full.
                if len(self._pending) < self._max_size and not self._closing:
                    oldest = next(iter(self._pending.values()))
                    remaining = oldest.enqueued_at + self._max_wait_s - time.monotonic()
                    if remaining > 0:
                        self._cond.wait(remaining)
                        continue  # re-check: full now? oldest cancelled? closing?

                batch = []
                while self._pending and len(batch) < self._max_size:
                    _, pending = self._pending.popitem(last=False)
                    # PENDING -> RUNNING; from here the caller cannot cancel.
                    # False means it was cancelled before we got to it: skip it.
                    try:
                        runnable = pending.future.set_running_or_notify_cancel()
                    except RuntimeError:
                        # Someone holding the future resolved it themselves
                        # (Future.set_result is public). Nothing left to do for
                        # it, and the worker must not die over it.
                        logger.warning(
                            "batching service %r: skipping an item whose future was "
                            "resolved outside the service", self._name,
                        )
                        continue
                    if runnable:
                        batch.append(pending)
                    else:
                        self._cancelled_items_total += 1
                if not batch:
                    continue

                started = time.monotonic()
                size = len(batch)
                self._batches_total += 1
                self._items_total += size
                self._batch_size_counts[size] = self._batch_size_counts.get(size, 0) + 1
                self._max_batch_size_seen = max(self._max_batch_size_seen, size)
                self._wait_seconds_sum += sum(started - p.enqueued_at for p in batch)
                return batch

    def _run_batch(self, batch: list[_PendingItem]) -> None:
        started = time.monotonic()
        failed = 0
        retried = False
        try:
            results, error = self._call_batch_fn([p.item for p in batch])
            if error is None:
                for pending, result in zip(batch, results):
                    self._set_result(pending.future, result)
            elif (
                isinstance(error, BatchSizeMismatch)
                or len(batch) == 1
                or not self._retry_individually
            ):
                # A wrong result count is a bug in batch_fn, not a bad item:
                # retrying items one by one would hide it, so fail them all.
                logger.error(
                    "batching service %r: batch_fn failed on a batch of %d items%s",
                    self._name, len(batch), _brief(error), exc_info=_traceback(error),
                )
                for pending in batch:
                    failed += 1
                    self._set_exception(pending.future, error)
            else:
                # Failure isolation: one bad item must not fail its batch-mates.
                # Re-run each item alone so only the items that really fail get
                # an exception.
                retried = True
                logger.warning(
                    "batching service %r: batch_fn raised %s on a batch of %d items; "
                    "retrying them one by one",
                    self._name, type(error).__name__, len(batch),
                )
                for pending in batch:
                    results, item_error = self._call_batch_fn([pending.item])
                    if item_error is None:
                        self._set_result(pending.future, results[0])
                    else:
                        logger.error(
                            "batching service %r: batch_fn failed on a single item%s",
                            self._name, _brief(item_error), exc_info=_traceback(item_error),
                        )
                        failed += 1
                        self._set_exception(pending.future, item_error)
        finally:
            elapsed = time.monotonic() - started
            with self._cond:
                self._run_seconds_sum += elapsed
                self._failed_items_total += failed
                self._retried_batches_total += retried

    def _call_batch_fn(self, items: list) -> tuple[list | None, BaseException | None]:
        """Call batch_fn; return (results, None) or (None, the error)."""
        try:
            results = self._batch_fn(items)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any error belongs to the items
            # Includes BaseExceptions such as GeneratorExit or
            # asyncio.CancelledError escaping batch_fn: they are the items'
            # failure, not a reason to stop the worker.
            return None, exc
        expected = len(items)
        # Strings and mappings have a length but are not one-result-per-item.
        if isinstance(results, (str, bytes, bytearray, Mapping)) or not (
            hasattr(results, "__len__") and hasattr(results, "__iter__")
        ):
            return None, BatchSizeMismatch(
                f"batching service {self._name!r}: batch_fn must return a sequence of "
                f"{expected} results, expected {expected} got a {type(results).__name__}"
            )
        try:
            results = list(results)
        except Exception as exc:  # noqa: BLE001 - a broken sequence type
            return None, exc
        if len(results) != expected:
            return None, BatchSizeMismatch(
                f"batching service {self._name!r}: batch_fn returned the wrong number "
                f"of results, expected {expected} got {len(results)}"
            )
        return results, None

    def _shut_down_after(self, batch: list[_PendingItem], exc: BaseException) -> None:
        with self._cond:
            self._closing = True
            abandoned = list(self._pending.values())
            self._pending.clear()
        failed = 0
        cancelled = 0
        for pending in batch:
            if not pending.future.done():
                failed += 1
                error = ServiceClosed(
                    f"batching service {self._name!r} stopped: batch_fn raised "
                    f"{type(exc).__name__}"
                )
                error.__cause__ = exc
                self._set_exception(pending.future, error)
        for pending in abandoned:
            if not pending.future.set_running_or_notify_cancel():
                cancelled += 1
                continue
            failed += 1
            error = ServiceClosed(
                f"batching service {self._name!r} shut down before this item ran "
                f"(batch_fn raised {type(exc).__name__})"
            )
            error.__cause__ = exc
            self._set_exception(pending.future, error)
        with self._cond:
            self._failed_items_total += failed
            self._cancelled_items_total += cancelled

    def _set_result(self, future: Future, result: Any) -> None:
        # Must not raise into the worker: the future may have been resolved by
        # someone else holding it (Future.set_result is public), and a done
        # callback could misbehave.
        try:
            future.set_result(result)
        except Exception:  # noqa: BLE001
            logger.exception("batching service %r: could not set a result", self._name)

    def _set_exception(self, future: Future, error: BaseException) -> None:
        try:
            future.set_exception(error)
        except Exception:  # noqa: BLE001
            logger.exception("batching service %r: could not set an exception", self._name)
