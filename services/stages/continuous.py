"""The generate stage: `submit(request) -> Future` as every stage, decoded by
`pipeline.continuous.ContinuousEngine` one iteration at a time. A request joins the running batch
at the next iteration; its tokens go to its reader (GenerationRequest.on_token) as they come, and
its future resolves with how its sequence ended (a pipeline.continuous.output.Finish): the text is
its output side's, never made here. Futures stay PENDING until then, so one cancelled mid-decode
leaves at the next iteration; `stop` ends one at its output side's word (a stop string), as
finished. Its batches are the requests taken off its queue together (once per iteration); what is
particular to generation is in `GenerationStats`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace

from pipeline.continuous import ContinuousEngine, EngineStats, SequenceState, StepResult
from pipeline.continuous.output import Finish
from services.server import stage_spans
from services.server.errors import ServiceClosed
from services.stages.batch_queue import BatchQueue, PendingItem
from services.stages.batch_stats import BatchingStats, with_observations
from services.stages.futures import Claim, claim, end_with_exception, end_with_result
from services.stages.holdings import Holdings

log = logging.getLogger(__name__)

# Retry-After for a full generate stage: a slot frees when a sequence finishes,
# which at up to 128 decode steps is seconds, not the milliseconds of a batch.
GENERATION_RETRY_AFTER_S = 5.0
# Upper bounds of the time-to-first-token histogram (seconds).
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
# Upper bounds of the time-per-output-token histogram (seconds), after the first token.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


@dataclass(frozen=True)
class GenerationCounters:
    """What decoding did. Immutable: swapped under the service's lock, so snapshots never share state."""
    decode_steps_total: int = 0
    # Decode steps by how many sequences decoded together.
    step_sequences_counts: dict[int, int] = field(default_factory=dict)
    max_step_sequences: int = 0
    tokens_generated_total: int = 0
    finished_sequences_total: int = 0
    # Cancelled by their caller after leaving the queue (waiting for a slot or decoding).
    cancelled_sequences_total: int = 0
    # Time to first token from submit: count per TTFT_BUCKETS bound (+ one over the last), and the sum.
    ttft_bucket_counts: tuple[int, ...] = (0,) * (len(TTFT_BUCKETS) + 1)
    ttft_seconds_sum: float = 0.0
    # Time per output token after the first, per sequence of two tokens or more: per TPOT_BUCKETS bound.
    tpot_bucket_counts: tuple[int, ...] = (0,) * (len(TPOT_BUCKETS) + 1)
    tpot_seconds_sum: float = 0.0

    def with_step(self, rows: int) -> GenerationCounters:
        counts = dict(self.step_sequences_counts)
        counts[rows] = counts.get(rows, 0) + 1
        return replace(self, decode_steps_total=self.decode_steps_total + 1, step_sequences_counts=counts,
                       max_step_sequences=max(self.max_step_sequences, rows))

    def with_finished(self, tokens: int, ttft_s: float | None, tpot_s: float | None = None) -> GenerationCounters:
        done = replace(self, tokens_generated_total=self.tokens_generated_total + tokens,
                       finished_sequences_total=self.finished_sequences_total + 1)
        if ttft_s is not None:
            done = replace(done, ttft_bucket_counts=with_observations(done.ttft_bucket_counts, TTFT_BUCKETS, [ttft_s]),
                           ttft_seconds_sum=done.ttft_seconds_sum + ttft_s)
        if tpot_s is not None:
            done = replace(done, tpot_bucket_counts=with_observations(done.tpot_bucket_counts, TPOT_BUCKETS, [tpot_s]),
                           tpot_seconds_sum=done.tpot_seconds_sum + tpot_s)
        return done


@dataclass(frozen=True)
class GenerationStats(GenerationCounters, EngineStats):
    """A consistent snapshot of the generate stage: its batches, its decoding and what its engine holds."""
    name: str = ""
    max_batch: int = 0  # GENERATE_MAX_BATCH: sequences holding a slot at once
    kv_tokens_capacity: int = 0  # GENERATE_KV_CACHE_TOKENS: the columns every slot takes together
    max_queue: int = 0
    batching: BatchingStats = field(default_factory=BatchingStats)

    def summary(self) -> dict:
        return {"batches": self.batching.batches_total, "items": self.batching.items_total,
                # The most sequences that decoded together: what batching buys for the LLM.
                "max_batch": self.max_step_sequences,
                "queue_depth": self.batching.queue_depth + self.waiting_sequences,
                "decode_steps": self.decode_steps_total, "running": self.running_sequences}


@dataclass(frozen=True)
class GenerationTicket:
    """The caller's handle carried by a sequence through the engine."""
    future: Future
    submitted_at: float
    on_token: Callable[[int], None] | None = None  # the request's stream reader, if it streams


class ContinuousGenerationService:
    def __init__(self, name: str, engine: ContinuousEngine, *, max_queue: int,
                 on_idle: Callable[[], None] | None = None, on_start: Callable[[], None] | None = None):
        self.name = name
        self.engine = engine
        self.max_batch = engine.scheduler.max_batch
        self.kv_tokens_capacity = engine.scheduler.slots.kv_cache_tokens
        self.max_wait_ms = 0.0
        self.max_queue = max_queue
        self._owner = f"generation service {name!r}"
        # Each iteration takes everything queued: no window, sequences join at once.
        self._queue = BatchQueue(name, max_size=max_queue, max_wait_ms=0, max_queue=max_queue)
        self._lock = threading.Lock()
        self._counters = GenerationCounters()
        self._gauges = EngineStats()
        # The futures of the sequences in the engine (whose own record holds the sequences).
        self._holdings = Holdings(self._queue, self._owner)
        self._abort = False
        self._stopping: set[Future] = set()  # futures whose sequences their output side ended (under _lock)
        self._on_idle = on_idle  # on the loop's thread before it waits with nothing to decode, as BatchingService's
        self._on_start = on_start  # on the loop's thread before it serves, as BatchingService's
        self._thread = threading.Thread(target=self._loop, name=f"continuous-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public face

    def submit(self, request) -> Future:
        return self._queue.put([request], busy=len(self._holdings),
                               retry_after_s=lambda _depth: GENERATION_RETRY_AFTER_S)[0]

    def stop(self, future: Future) -> None:
        """End the sequence of `future` (a future submit returned) at the next iteration, as finished:
        its output side has its answer (a stop string). Its future resolves with Finish.ABORTED; a
        no-op once it ended. Any thread."""
        with self._lock:
            self._stopping.add(future)

    def close(self, timeout: float | None = None) -> None:
        """Finish what it holds (waiting up to timeout), then stop; past it, fail what is left."""
        self._queue.close()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abort = True  # the loop stops after its current iteration
            self._thread.join()

    def abort(self, reason: str) -> None:
        """Refuse new requests and fail every held one now, decoding ones included; returns at once.
        The loop thread, which owns the engine, stops after its current iteration."""
        self._abort = True
        self._holdings.abort(reason)

    @property
    def failure(self) -> str | None:
        return self._queue.failure

    def stats(self) -> GenerationStats:
        batching = self._queue.snapshot()
        with self._lock:
            counters = {f.name: getattr(self._counters, f.name) for f in fields(GenerationCounters)}
            counters["step_sequences_counts"] = dict(self._counters.step_sequences_counts)
            return GenerationStats(**counters, **vars(self._gauges), name=self.name, max_batch=self.max_batch,
                                   kv_tokens_capacity=self.kv_tokens_capacity, max_queue=self.max_queue, batching=batching)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            self._serve()
            self._queue.fail_queued("the service stopped")
            self._end_active(lambda: ServiceClosed(f"{self._owner} shut down before this request finished"))
        except BaseException as exc:  # noqa: BLE001 - nothing may end this thread silently
            # The engine is not touched again (its cleanup may be what failed): only the futures.
            self._holdings.die(exc)

    def _serve(self) -> None:
        while not self._abort:
            if not self.engine.has_work():
                if self._on_idle is not None and not len(self._queue):
                    self._on_idle()
                if not self._queue.wait_for_items():
                    return  # closing, nothing queued, nothing running
            try:
                self._iterate()
            except Exception:  # one failed iteration fails its sequences; the loop goes on
                log.exception("%s: iteration failed; failing its sequences", self._owner)
                # Raises only when the engine's own cleanup fails: then _loop declares the stage dead.
                self._end_active(lambda: RuntimeError("generation failed"))

    def _iterate(self) -> None:
        self._admit(self._queue.take(self.max_queue, start_running=False))
        self._drop_cancelled()
        self._end_stopped()
        if self.engine.has_work():
            started = time.perf_counter()
            result = self.engine.step()
            self._queue.record(run_seconds_sum=time.perf_counter() - started)
            self._account(result)
        self._measure()

    def _admit(self, batch: list[PendingItem]) -> None:
        running = len(self._holdings) + len(batch)  # the batch each joins: a traced request's batch size
        # Held at once, before encoding their prompts: off the queue, they count against max_queue here.
        self._holdings.hold([pending.future for pending in batch])
        for pending in batch:
            request = stage_spans.admitted(pending.item, running)
            ticket = GenerationTicket(pending.future, pending.enqueued_at, getattr(request, "on_token", None))
            try:
                self.engine.add(request, payload=ticket)
            except Exception as exc:  # e.g. a prompt over the KV-cache budget: this request alone
                self._fail(ticket, exc)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.engine.sequences() if s.payload.future.cancelled()]:
            self.engine.cancel(seq)
            self._holdings.release([seq.payload.future])
            claim(seq.payload.future, self._owner)  # CANCELLED -> notified, so wait() counts it done
            with self._lock:
                self._counters = replace(self._counters,
                                         cancelled_sequences_total=self._counters.cancelled_sequences_total + 1)

    def _end_stopped(self) -> None:
        with self._lock:
            stopping, self._stopping = self._stopping, set()
        if not stopping:
            return
        for seq in [s for s in self.engine.sequences() if s.payload.future in stopping]:
            self.engine.cancel(seq)
            self._finish(seq, Finish.ABORTED)

    def _account(self, result: StepResult) -> None:
        if result.decoded_rows:
            with self._lock:
                self._counters = self._counters.with_step(result.decoded_rows)
        for seq, token in result.tokens:  # before any future resolves: a stream reads its last token first
            self._stream(seq.payload, token)
        for seq in result.finished:
            self._finish(seq, self.engine.finish_of(seq))
        for seq, exc in result.failed:
            log.warning("%s: a sequence failed: %s", self._owner, type(exc).__name__)
            self._fail(seq.payload, exc)

    def _measure(self) -> None:
        gauges = self.engine.stats()
        with self._lock:
            self._gauges = gauges

    def _finish(self, seq: SequenceState, finish: Finish) -> None:
        ticket: GenerationTicket = seq.payload
        self._holdings.release([ticket.future])
        first, tokens = seq.first_token_at, len(seq.generated)
        ttft = tpot = None
        if first is not None:
            ttft = first - ticket.submitted_at
            # The scheduler stamps first_token_at with time.monotonic (its default clock), as here.
            tpot = (time.monotonic() - first) / (tokens - 1) if tokens > 1 else None
        with self._lock:
            self._counters = self._counters.with_finished(tokens, ttft, tpot)
        end_with_result(ticket.future, finish, self._owner)

    def _stream(self, ticket: GenerationTicket, token: int) -> None:
        if ticket.on_token is None or ticket.future.done():  # not streamed, or its caller is gone
            return
        try:
            ticket.on_token(token)
        except Exception:  # noqa: BLE001 - a reader's bug must not stop the engine for everyone
            log.exception("%s: a stream's reader failed on a token; the answer still completes", self._owner)

    def _fail(self, ticket: GenerationTicket, error: BaseException) -> None:
        self._holdings.release([ticket.future])
        if end_with_exception(ticket.future, error, self._owner) is Claim.RUN:
            self._queue.record(failed_items_total=1)

    def _end_active(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every sequence in the engine, then release them from it: the futures first, so their
        callers are answered even when the engine's cleanup raises (the stage is then dead)."""
        self._holdings.fail_held(make_error)
        for seq in self.engine.sequences():
            self.engine.cancel(seq)
        self._measure()
