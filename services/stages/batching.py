"""Opportunistic batching on a dedicated thread: many ``submit(item)`` calls become calls of
``batch_fn(items)``, each caller holding a Future for its own result.

As Ray Serve's ``serve.batch``: ``BatchQueue`` decides when a batch closes (``max_size`` items,
``max_wait_ms`` after its oldest item, or at once when no request in flight may still join it: the
node's ``Upstream``, watched under the service's name), this module runs it on one daemon thread per service,
and each way a future ends has one helper in ``services.stages.futures``.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

from services.server.errors import BatchSizeMismatch
from services.stages.batch_queue import BatchQueue, PendingItem
from services.stages.batch_stats import BatchingStats
from services.stages.futures import set_exception, set_result
from services.stages.holdings import Holdings
from services.stages.upstream import Upstream

logger = logging.getLogger(__name__)


def _traceback(error: BaseException) -> BaseException | None:
    """A deadline that ran out is an outcome, not a bug: one line, no traceback."""
    return None if isinstance(error, TimeoutError) else error


def _brief(error: BaseException) -> str:
    return f": {type(error).__name__}: {error}" if isinstance(error, TimeoutError) else ""


class BatchingService:
    """``batch_fn(items) -> results``, one per item in order, runs on the service's thread only."""

    def __init__(self, name: str, batch_fn: Callable[[list], list], *, max_size: int, max_wait_ms: float,
                 max_queue: int = 1024, retry_individually: bool = True, upstream: Upstream | None = None,
                 on_idle: Callable[[], None] | None = None, on_start: Callable[[], None] | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if not callable(batch_fn):
            raise ValueError(f"batch_fn must be callable, got {type(batch_fn).__name__}")
        self._name = name
        self._owner = f"batching service {name!r}"
        self._batch_fn = batch_fn
        self._upstream = upstream
        self._queue = BatchQueue(name, max_size=max_size, max_wait_ms=max_wait_ms, max_queue=max_queue,
                                 may_join=partial(upstream.may_join, name) if upstream is not None else None)
        if upstream is not None:
            upstream.watch(name, self._queue.wake)
        self._retry_individually = bool(retry_individually)
        # On the service's thread whenever it finds nothing queued and is about to wait (a worker's
        # stages hand back their OpenMP workers there: pipeline.openmp_workers).
        self._on_idle = on_idle
        # On the service's thread before its first batch (a worker's stages on a GPU take a CUDA stream of their
        # own there: pipeline.cuda_streams); raising, it takes the stage down as a dying batch_fn would.
        self._on_start = on_start
        # The batch inside batch_fn now: abort() and a dying thread fail it.
        self._holdings = Holdings(self._queue, self._owner)
        # Daemon: a service someone forgot to close must not keep the process alive.
        self._thread = threading.Thread(target=self._worker_loop, name=f"batching-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_size(self) -> int:
        return self._queue.max_size

    @property
    def max_wait_ms(self) -> float:
        return self._queue.max_wait_ms

    def submit(self, item: Any) -> Future:
        """A Future for the item's result; Overloaded when the queue is full, ServiceClosed once closed."""
        return self._queue.put([item])[0]

    def submit_many(self, items: Iterable[Any]) -> list[Future]:
        """Queue a request's items all or none, side by side (so they tend to share a batch).
        Overloaded if they do not all fit now; ValueError if they never could (over max_queue)."""
        items = list(items)
        if len(items) > self._queue.max_queue:
            raise ValueError(f"{self._owner}: cannot submit {len(items)} items at once, "
                             f"max_queue is {self._queue.max_queue}")
        if not items:
            return []
        return self._queue.put(items)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new items and finish the queued ones, waiting up to ``timeout`` (None: forever);
        what is still queued then fails with ServiceClosed. A batch in ``batch_fn`` runs to its end.
        Idempotent: a second call waits for the worker again."""
        if not self._queue.closing:
            logger.debug("%s closing", self._owner)
        self._queue.close()
        if self._upstream is not None:
            self._upstream.unwatch(self._name, self._queue.wake)
        if threading.current_thread() is self._thread:
            # close() from inside batch_fn: joining ourselves would deadlock.
            # The loop exits after the current batch once the queue is empty.
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._queue.fail_queued(f"close timed out after {timeout}s")

    def abort(self, reason: str) -> None:
        """Refuse new items and fail every held one now, the batch inside batch_fn included (its
        results, when they come, are dropped). Returns at once."""
        self._holdings.abort(reason)

    @property
    def failure(self) -> str | None:
        return self._queue.failure

    def stats(self) -> BatchingStats:
        return self._queue.snapshot()

    def __enter__(self) -> BatchingService:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        q = self._queue
        return (f"BatchingService(name={self._name!r}, max_size={q.max_size}, "
                f"max_wait_ms={q.max_wait_ms}, max_queue={q.max_queue})")

    # ---------------------------------------------------------------- worker

    def _worker_loop(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - nothing may end this thread silently
            # batch_fn's KeyboardInterrupt or SystemExit (sys.exit() in a thread ends that thread),
            # or a bug here whose cleanup failed too: the stage is down.
            self._holdings.die(exc)

    def _serve(self) -> None:
        while True:
            if self._on_idle is not None and not len(self._queue):
                self._on_idle()  # an item queued meanwhile only finds it done: next_batch() takes it
            batch = self._queue.next_batch()
            if batch is None:
                logger.debug("%s worker stopped", self._owner)
                return
            futures = [pending.future for pending in batch]
            self._holdings.hold(futures)
            try:
                self._run_batch(batch)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:
                # A bug here (batch_fn's errors are _run_batch's): fail what is unresolved, serve on.
                # Should this cleanup fail too, _worker_loop declares the stage dead.
                logger.exception("%s: internal error in worker", self._owner)
                self._holdings.fail_held(lambda: RuntimeError(f"{self._owner}: internal error"))
            self._holdings.release(futures)  # not in a finally: a dying thread still fails the batch

    def _run_batch(self, batch: list[PendingItem]) -> None:
        started = time.monotonic()
        failed = retried = 0
        try:
            outcome = self._call_batch_fn([p.item for p in batch])
            # A wrong result count is batch_fn's bug, not a bad item's: retrying would hide it.
            if isinstance(outcome, BaseException) and not isinstance(outcome, BatchSizeMismatch) \
                    and len(batch) > 1 and self._retry_individually:
                # Failure isolation: one bad item must not fail its batch-mates.
                logger.warning("%s: batch_fn raised %s on a batch of %d items; retrying them one by one",
                               self._owner, type(outcome).__name__, len(batch))
                retried = 1
                failed = sum(self._settle([p], self._call_batch_fn([p.item]), "a single item") for p in batch)
            else:
                failed = self._settle(batch, outcome, f"a batch of {len(batch)} items")
        finally:
            self._queue.record(run_seconds_sum=time.monotonic() - started, failed_items_total=failed,
                               retried_batches_total=retried)

    def _settle(self, batch: list[PendingItem], outcome: list | BaseException, what: str) -> int:
        """Resolve the batch's futures with its results, or fail them all; how many failed."""
        if not isinstance(outcome, BaseException):
            for pending, result in zip(batch, outcome):
                set_result(pending.future, result, self._owner)
            return 0
        logger.error("%s: batch_fn failed on %s%s", self._owner, what, _brief(outcome), exc_info=_traceback(outcome))
        for pending in batch:
            set_exception(pending.future, outcome, self._owner)
        return len(batch)

    def _call_batch_fn(self, items: list) -> list | BaseException:
        """Call batch_fn: one result per item, in order, or the error that stands for them all."""
        try:
            results = self._batch_fn(items)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any error (GeneratorExit too) belongs to the items
            return exc
        expected = len(items)
        # Strings and mappings have a length but are not one-result-per-item.
        if isinstance(results, (str, bytes, bytearray, Mapping)) or not (
                hasattr(results, "__len__") and hasattr(results, "__iter__")):
            return BatchSizeMismatch(f"{self._owner}: batch_fn must return a sequence of {expected} results, "
                                     f"expected {expected} got a {type(results).__name__}")
        try:
            results = list(results)
        except Exception as exc:  # noqa: BLE001 - a broken sequence type
            return exc
        if len(results) != expected:
            return BatchSizeMismatch(f"{self._owner}: batch_fn returned the wrong number of results, "
                                     f"expected {expected} got {len(results)}")
        return results
