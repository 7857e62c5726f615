"""The generate stage with continuous batching, behind the BatchingService face.

`submit(request) -> Future` as for every stage, but behind it decoding is
scheduled per iteration by `pipeline.continuous.ContinuousEngine`: a request
joins the running batch at the next step, and its future resolves the moment
its sequence finishes. A future cancelled while its sequence decodes leaves
the batch at the next step (futures stay pending until the answer is set, so
`cancel()` works mid-decode).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future

from pipeline.continuous import ContinuousEngine, SequenceState
from services.batching import BatchingStats, Overloaded, ServiceClosed

log = logging.getLogger(__name__)


class ContinuousGenerationService:
    def __init__(self, name: str, engine: ContinuousEngine, *, max_queue: int):
        self.name = name
        self.engine = engine
        self.max_size = engine.scheduler.max_seqs
        self.max_wait_ms = 0.0
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._incoming: deque[tuple[object, Future, float]] = deque()
        self._active: dict[int, SequenceState] = {}
        self._closed = False
        self._abort = False
        # counters (under _cond)
        self._steps = 0
        self._items = 0
        self._failed = 0
        self._cancelled = 0
        self._rows_hist: dict[int, int] = {}
        self._wait_s = 0.0
        self._run_s = 0.0
        self._max_rows = 0
        self._tokens = 0
        self._ttft: deque[float] = deque(maxlen=1024)
        self._ttft_admitted: deque[float] = deque(maxlen=1024)
        self._thread = threading.Thread(target=self._loop, name=f"continuous-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public face

    def submit(self, request) -> Future:
        with self._cond:
            if self._closed:
                raise ServiceClosed(f"{self.name} is closed")
            if len(self._incoming) + len(self._active) >= self.max_queue:
                raise Overloaded(f"{self.name} holds {self.max_queue} requests, its limit", retry_after_s=5.0)
            future: Future = Future()
            self._incoming.append((request, future, time.monotonic()))
            self._cond.notify()
        return future

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self._abort = True
                self._cond.notify()
            self._thread.join()

    def stats(self) -> BatchingStats:
        with self._cond:
            return BatchingStats(
                name=self.name, max_size=self.max_size, max_wait_ms=0.0, max_queue=self.max_queue,
                batches_total=self._steps, items_total=self._items, failed_items_total=self._failed,
                cancelled_items_total=self._cancelled, retried_batches_total=0,
                queue_depth=len(self._incoming) + len(self.engine.scheduler.waiting),
                batch_size_counts=dict(self._rows_hist), wait_seconds_sum=self._wait_s,
                run_seconds_sum=self._run_s, max_batch_size_seen=self._max_rows)

    def generated_tokens_total(self) -> int:
        with self._cond:
            return self._tokens

    def ttft_seconds(self, since_admission: bool = False) -> list[float]:
        """Time to first token from submit (queueing for a slot included) or from admission."""
        with self._cond:
            return list(self._ttft_admitted if since_admission else self._ttft)

    # ------------------------------------------------------------------ the loop

    def _admit(self, batch) -> None:
        for request, future, submitted in batch:
            if future.cancelled():
                with self._cond:
                    self._cancelled += 1
                continue
            try:
                seq = self.engine.add(request, payload=(future, submitted))
            except Exception as exc:  # e.g. a prompt over the token budget: this request alone
                self._fail(future, exc)
                continue
            self._active[seq.seq_id] = seq

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._active.values() if s.payload[0].cancelled()]:
            self.engine.cancel(seq)
            del self._active[seq.seq_id]
            with self._cond:
                self._cancelled += 1

    def _fail(self, future: Future, exc: BaseException) -> None:
        with self._cond:
            self._failed += 1
        if future.set_running_or_notify_cancel():
            future.set_exception(exc)

    def _finish(self, seq: SequenceState) -> None:
        future, submitted = seq.payload
        self._active.pop(seq.seq_id, None)
        text = self.engine.text(seq)
        with self._cond:
            self._items += 1
            self._tokens += len(seq.generated)
            if seq.first_token_at is not None:
                self._ttft.append(seq.first_token_at - submitted)
                self._ttft_admitted.append(seq.first_token_at - (seq.admitted_at or submitted))
                self._wait_s += seq.first_token_at - submitted
        if future.set_running_or_notify_cancel():
            future.set_result(text)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._incoming and not self._active and not self._closed:
                    self._cond.wait()
                if self._abort or (self._closed and not self._incoming and not self._active):
                    break
                batch = list(self._incoming)
                self._incoming.clear()
            try:
                self._admit(batch)
                self._drop_cancelled()
                if not self._active:
                    continue
                started = time.perf_counter()
                result = self.engine.step()
                elapsed = time.perf_counter() - started
                with self._cond:
                    self._run_s += elapsed
                    if result.decoded_rows:
                        self._steps += 1
                        self._rows_hist[result.decoded_rows] = self._rows_hist.get(result.decoded_rows, 0) + 1
                        self._max_rows = max(self._max_rows, result.decoded_rows)
                for seq in result.finished:
                    self._finish(seq)
                for seq, exc in result.failed:
                    self._active.pop(seq.seq_id, None)
                    log.warning("%s: a sequence failed: %s", self.name, type(exc).__name__)
                    self._fail(seq.payload[0], exc)
            except Exception:  # the loop must survive anything
                log.exception("%s: iteration failed; failing its sequences", self.name)
                for seq in list(self._active.values()):
                    self.engine.cancel(seq)
                    self._fail(seq.payload[0], RuntimeError("generation failed"))
                self._active.clear()
        # shutdown: whatever is left gets a clear error
        with self._cond:
            leftover = list(self._incoming)
            self._incoming.clear()
        for _request, future, _t in leftover:
            self._fail(future, ServiceClosed(f"{self.name} shut down before this request ran"))
        for seq in list(self._active.values()):
            self._fail(seq.payload[0], ServiceClosed(f"{self.name} shut down before this request finished"))
        self._active.clear()
