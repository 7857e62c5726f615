"""Tests for services.stages.batching.BatchingService.

Timing is controlled with events and a gate inside batch_fn, and waits are on
conditions (the worker's state, a window that has passed). A sleep is only ever
an input: the stress test's batch_fn taking its time, a gap between two arrivals.
The few timing assertions (a batch window) use generous tolerances and compare
against times recorded inside batch_fn, so they hold on a loaded 2-core machine.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import pickle
import random
import threading
import time
from collections import Counter
from concurrent.futures import CancelledError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.server.errors import BatchSizeMismatch, Overloaded, ServiceClosed, StageDown
from services.stages.batch_stats import BatchingStats
from services.stages.batching import BatchingService
from tests.helpers import blocked_in, wait_until

RESULT_TIMEOUT = 10.0  # seconds; only reached when something is broken


class Recorder:
    """A batch_fn that records every batch and can be held shut by a gate.

    ``gate`` starts open. Close it, and the next batch_fn call blocks after
    recording its batch until ``gate.set()``; ``wait_calls(n)`` waits until n
    calls have started, which tells a test the worker is busy.
    """

    def __init__(self, fn=lambda items: [x * 2 for x in items]):
        self.fn = fn
        self.batches: list[list] = []
        self.starts: list[float] = []
        self.gate = threading.Event()
        self.gate.set()
        self._cond = threading.Condition()

    def __call__(self, items):
        with self._cond:
            self.batches.append(list(items))
            self.starts.append(time.monotonic())
            self._cond.notify_all()
        assert self.gate.wait(RESULT_TIMEOUT), "gate never opened"
        return self.fn(items)

    def wait_calls(self, n: int, timeout: float = RESULT_TIMEOUT) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.batches) >= n, timeout), (
                f"expected {n} batch_fn calls, saw {len(self.batches)}"
            )

    @property
    def items_seen(self) -> list:
        return [x for batch in self.batches for x in batch]


def block_worker(svc: BatchingService, rec: Recorder, item="blocker"):
    """Close the gate and make the worker enter batch_fn; return that future."""
    rec.gate.clear()
    calls_before = len(rec.batches)
    fut = svc.submit(item)
    rec.wait_calls(calls_before + 1)
    return fut


@pytest.fixture
def services():
    """Create services that are closed (and unblocked) at test teardown."""
    created: list[tuple[BatchingService, Recorder]] = []

    def make(rec: Recorder | None = None, **kwargs):
        rec = rec or Recorder()
        kwargs.setdefault("max_size", 4)
        kwargs.setdefault("max_wait_ms", 5)
        name = kwargs.pop("name", f"svc-{len(created)}")
        svc = BatchingService(name, rec, **kwargs)
        created.append((svc, rec))
        return svc, rec

    yield make
    for svc, rec in created:
        rec.gate.set()
        svc.close(timeout=RESULT_TIMEOUT)


def worker_thread(svc: BatchingService) -> threading.Thread | None:
    for t in threading.enumerate():
        if t.name == f"batching-{svc.name}":
            return t
    return None


def waiting_out_a_window(svc: BatchingService) -> bool:
    """Whether the worker is in BatchQueue.next_batch's timed wait: a batch's window is open and the
    worker waits until it closes or something wakes it."""
    waiting = blocked_in(worker_thread(svc), "next_batch")
    return waiting is not None and waiting.get("timeout") is not None


# ---------------------------------------------------------------- stress


@pytest.mark.timeout(60)
def test_stress_many_threads_each_future_gets_its_own_result():
    n_threads, per_thread, max_size = 40, 250, 16
    rng = random.Random(1234)  # only touched by the worker thread
    sizes_lock = threading.Lock()
    sizes: list[int] = []
    seen: Counter = Counter()

    def batch_fn(items):
        with sizes_lock:
            sizes.append(len(items))
            seen.update(items)
        time.sleep(rng.uniform(0, 0.001))
        return [x * 2 for x in items]

    svc = BatchingService("stress", batch_fn, max_size=max_size, max_wait_ms=2)
    try:
        start = threading.Barrier(n_threads)
        errors: list[BaseException] = []
        done_counts: Counter = Counter()
        done_lock = threading.Lock()

        def on_done(value):
            # Keyed by the item (unique), not id(fut): ids of collected futures recur.
            def callback(fut):
                with done_lock:
                    done_counts[value] += 1

            return callback

        def client(tid: int):
            try:
                crng = random.Random(tid)
                values = [tid * 100_000 + i for i in range(per_thread)]
                start.wait()
                i = 0
                while i < len(values):
                    # Pipeline a few requests at a time; sometimes as one
                    # submit_many (a request's sub-items), sometimes one by one.
                    chunk = values[i : i + crng.randint(1, 4)]
                    i += len(chunk)
                    if crng.random() < 0.5:
                        futs = svc.submit_many(chunk)
                    else:
                        futs = [svc.submit(v) for v in chunk]
                    for v, f in zip(chunk, futs):
                        f.add_done_callback(on_done(v))
                    for v, f in zip(chunk, futs):
                        assert f.result(timeout=RESULT_TIMEOUT) == v * 2
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert not any(t.is_alive() for t in threads), "clients hung"
        assert not errors, errors[:3]
    finally:
        svc.close(timeout=RESULT_TIMEOUT)

    total = n_threads * per_thread
    # Every item reached batch_fn exactly once, and every future resolved once.
    assert len(seen) == total and set(seen.values()) == {1}
    assert len(done_counts) == total and set(done_counts.values()) == {1}
    assert max(sizes) <= max_size
    assert max(sizes) > 1, "no batching happened under load"
    stats = svc.stats()
    assert stats.items_total == total
    assert stats.batches_total == len(sizes)
    assert stats.batch_size_counts == dict(Counter(sizes))
    assert sum(size * count for size, count in stats.batch_size_counts.items()) == total
    assert stats.max_batch_size_seen == max(sizes)
    assert stats.failed_items_total == 0 and stats.cancelled_items_total == 0
    assert stats.queue_depth == 0
    assert stats.wait_seconds_sum > 0 and stats.run_seconds_sum > 0


# ------------------------------------------------------------ batch windows


@pytest.mark.timeout(30)
def test_lone_request_runs_alone_within_max_wait(services):
    svc, rec = services(max_size=8, max_wait_ms=50)
    t0 = time.monotonic()
    assert svc.submit(21).result(timeout=RESULT_TIMEOUT) == 42
    elapsed = time.monotonic() - t0
    assert rec.batches == [[21]]
    # It waits for the window (opportunistic batching) but no longer than it.
    assert rec.starts[0] - t0 >= 0.050 - 0.002
    assert elapsed < 0.050 + 0.200


@pytest.mark.timeout(30)
def test_full_batch_does_not_wait_for_window(services):
    svc, rec = services(max_size=4, max_wait_ms=2000)
    t0 = time.monotonic()
    futs = [svc.submit(i) for i in range(4)]
    assert [f.result(timeout=RESULT_TIMEOUT) for f in futs] == [0, 2, 4, 6]
    assert time.monotonic() - t0 < 1.0  # far below the 2 s window
    assert rec.batches == [[0, 1, 2, 3]]


@pytest.mark.timeout(30)
def test_batch_filling_up_during_window_goes_when_full(services):
    svc, rec = services(max_size=4, max_wait_ms=2000)
    first = svc.submit(0)
    # The worker waits out the first item's window: what the full batch must wake it from.
    wait_until(lambda: waiting_out_a_window(svc), RESULT_TIMEOUT, "the worker never waited on the window")
    assert not first.done()
    t0 = time.monotonic()
    rest = [svc.submit(i) for i in range(1, 4)]  # the 4th item fills the batch
    assert [f.result(timeout=RESULT_TIMEOUT) for f in [first, *rest]] == [0, 2, 4, 6]
    assert time.monotonic() - t0 < 1.0  # woken by the full batch, not the 2 s window
    assert rec.batches == [[0, 1, 2, 3]]


@pytest.mark.timeout(30)
def test_worker_takes_full_batches_at_once_after_a_busy_batch(services):
    max_size = 4
    svc, rec = services(max_size=max_size, max_wait_ms=10_000)
    # A full first batch goes at once and blocks inside batch_fn.
    rec.gate.clear()
    first = svc.submit_many(["a", "b", "c", "d"])
    rec.wait_calls(1)
    queued = svc.submit_many(range(3 * max_size))
    assert svc.stats().queue_depth == 3 * max_size
    t0 = time.monotonic()
    rec.gate.set()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in queued] == [2 * i for i in range(12)]
    # With a 10 s window, any wait would show; the full batches went at once.
    assert time.monotonic() - t0 < 2.0
    assert [len(b) for b in rec.batches] == [4, 4, 4, 4]
    assert rec.batches[1:] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(f.result(timeout=RESULT_TIMEOUT) for f in first)


@pytest.mark.timeout(30)
def test_partial_batch_whose_window_expired_goes_right_after_busy_batch(services):
    svc, rec = services(max_size=8, max_wait_ms=300)
    block_worker(svc, rec)
    queued = [svc.submit(i) for i in range(3)]
    # The oldest queued item's window passes while the worker is busy.
    wait_until(lambda: svc._queue.due_in() == 0, RESULT_TIMEOUT, "the queued items' window never passed")
    t_release = time.monotonic()
    rec.gate.set()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in queued] == [0, 2, 4]
    assert rec.batches[1] == [0, 1, 2]
    # Did not open a fresh 300 ms window after the busy batch.
    assert rec.starts[1] - t_release < 0.200


@pytest.mark.timeout(30)
def test_window_is_measured_from_the_oldest_item(services):
    window = 0.5  # longer than the 200 ms gap below: both items share the batch
    svc, rec = services(max_size=10, max_wait_ms=window * 1000)
    t_a = time.monotonic()
    fa = svc.submit("a")
    time.sleep(0.2)  # the input under test, not a wait for anything: the newer item arrives 200 ms later
    t_b = time.monotonic()
    fb = svc.submit("b")
    assert fa.result(timeout=RESULT_TIMEOUT) == "aa"
    assert fb.result(timeout=RESULT_TIMEOUT) == "bb"
    assert rec.batches == [["a", "b"]]
    start = rec.starts[0]
    assert start - t_a >= window - 0.002  # waited for a's full window...
    assert start < t_b + window  # ...but not for b's


@pytest.mark.timeout(30)
def test_max_wait_zero_takes_whatever_is_waiting(services):
    svc, rec = services(max_size=8, max_wait_ms=0)
    block_worker(svc, rec)
    queued = [svc.submit(i) for i in range(3)]
    rec.gate.set()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in queued] == [0, 2, 4]
    assert rec.batches[1] == [0, 1, 2]
    t0 = time.monotonic()
    assert svc.submit(5).result(timeout=RESULT_TIMEOUT) == 10
    assert time.monotonic() - t0 < 0.5
    assert rec.batches[2] == [5]


# --------------------------------------------------------- failure isolation

POISON = "poison"


def poison_fn(items):
    if POISON in items:
        raise ValueError("bad item")
    return [x * 2 for x in items]


@pytest.mark.timeout(30)
def test_poison_item_fails_alone_and_worker_survives(services, caplog):
    svc, rec = services(Recorder(poison_fn), max_size=4, max_wait_ms=10_000, name="reranker")
    with caplog.at_level(logging.WARNING, logger="services.stages.batching"):
        futs = svc.submit_many([1, 2, POISON, 4])
        assert futs[0].result(timeout=RESULT_TIMEOUT) == 2
        assert futs[1].result(timeout=RESULT_TIMEOUT) == 4
        assert futs[3].result(timeout=RESULT_TIMEOUT) == 8
        with pytest.raises(ValueError, match="bad item"):
            futs[2].result(timeout=RESULT_TIMEOUT)
    assert rec.batches == [[1, 2, POISON, 4], [1], [2], [POISON], [4]]
    messages = [r.getMessage() for r in caplog.records if r.name == "services.stages.batching"]
    assert messages and all("reranker" in m for m in messages)
    assert not any(POISON in m for m in messages)  # no item contents in log lines
    stats = svc.stats()
    assert stats.failed_items_total == 1
    assert stats.retried_batches_total == 1
    assert stats.batches_total == 1 and stats.items_total == 4
    # The worker is alive and keeps batching.
    later = svc.submit_many([5, 6, 7, 8])
    assert [f.result(timeout=RESULT_TIMEOUT) for f in later] == [10, 12, 14, 16]


@pytest.mark.timeout(30)
def test_a_deadline_that_ran_out_is_logged_in_one_line_a_bug_with_its_traceback(services, caplog):
    def fn(items):
        if items == ["late"]:
            raise TimeoutError("search gave up at the request's deadline")
        raise ValueError("a bug")
    svc, _ = services(Recorder(fn), max_size=1, max_wait_ms=0, name="search")
    with caplog.at_level(logging.WARNING, logger="services.stages.batching"):
        with pytest.raises(TimeoutError):
            svc.submit("late").result(timeout=RESULT_TIMEOUT)
        with pytest.raises(ValueError):
            svc.submit("other").result(timeout=RESULT_TIMEOUT)
    late, bug = [r for r in caplog.records if r.name == "services.stages.batching"]
    assert "TimeoutError: search gave up" in late.getMessage() and late.exc_info is None
    assert bug.exc_info is not None and bug.exc_info[0] is ValueError


@pytest.mark.timeout(30)
def test_single_item_failure_is_not_retried(services):
    svc, rec = services(Recorder(poison_fn), max_size=4, max_wait_ms=0)
    with pytest.raises(ValueError):
        svc.submit(POISON).result(timeout=RESULT_TIMEOUT)
    assert rec.batches == [[POISON]]


@pytest.mark.timeout(30)
def test_retry_individually_false_fails_whole_batch(services):
    svc, rec = services(
        Recorder(poison_fn), max_size=3, max_wait_ms=10_000, retry_individually=False
    )
    futs = svc.submit_many([1, POISON, 3])
    for f in futs:
        with pytest.raises(ValueError):
            f.result(timeout=RESULT_TIMEOUT)
    assert rec.batches == [[1, POISON, 3]]
    assert svc.stats().failed_items_total == 3


class CustomBase(BaseException):
    pass


@pytest.mark.timeout(30)
def test_base_exception_from_batch_fn_fails_items_but_not_worker(services):
    def fn(items):
        if "boom" in items:
            raise CustomBase("not an Exception")
        return items

    svc, _ = services(Recorder(fn), max_size=2, max_wait_ms=10_000)
    futs = svc.submit_many(["ok", "boom"])
    assert futs[0].result(timeout=RESULT_TIMEOUT) == "ok"
    with pytest.raises(CustomBase):
        futs[1].result(timeout=RESULT_TIMEOUT)
    assert svc.submit_many(["x", "y"])[1].result(timeout=RESULT_TIMEOUT) == "y"


@pytest.mark.timeout(30)
def test_system_exit_in_batch_fn_shuts_service_down_without_hanging_callers(services):
    def fn(items):
        if "exit" in items:
            raise SystemExit(3)
        return items

    svc, rec = services(Recorder(fn), max_size=1, max_wait_ms=0)
    block_worker(svc, rec, item="first")
    doomed = svc.submit("exit")
    queued = svc.submit("after")
    rec.gate.set()
    for f in (doomed, queued):
        with pytest.raises(ServiceClosed) as info:
            f.result(timeout=RESULT_TIMEOUT)
    assert isinstance(info.value.__cause__, SystemExit)
    with pytest.raises(ServiceClosed):
        svc.submit("more")
    t = worker_thread(svc)
    if t is not None:
        t.join(RESULT_TIMEOUT)
        assert not t.is_alive()


@pytest.mark.parametrize(
    "bad_fn, got",
    [
        (lambda items: items[:-1], "got 2"),
        (lambda items: items + items, "got 6"),
        (lambda items: None, "got a NoneType"),
        (lambda items: "abc", "got a str"),
        (lambda items: (x for x in items), "got a generator"),
    ],
    ids=["short", "long", "none", "str", "generator"],
)
@pytest.mark.timeout(30)
def test_wrong_result_count_fails_every_item_without_retry(services, bad_fn, got):
    calls = []

    def fn(items):
        calls.append(list(items))
        if items == ["probe"]:
            return ["alive"]
        return bad_fn(items)

    svc, _ = services(Recorder(fn), max_size=3, max_wait_ms=10_000)
    futs = svc.submit_many([1, 2, 3])
    for f in futs:
        with pytest.raises(BatchSizeMismatch, match="expected 3") as info:
            f.result(timeout=RESULT_TIMEOUT)
        assert got in str(info.value)
    assert calls == [[1, 2, 3]]  # no one-by-one retry
    assert svc.stats().failed_items_total == 3
    probe = svc.submit("probe")  # worker alive (lone item, window is long)
    svc.close(timeout=RESULT_TIMEOUT)  # close flushes without waiting the window
    assert probe.result(timeout=RESULT_TIMEOUT) == "alive"


@pytest.mark.timeout(30)
def test_future_resolved_elsewhere_while_running_does_not_kill_worker(services):
    hijacked = []

    def fn(items):
        # Someone else resolves a future while its batch runs: our own
        # set_result then raises InvalidStateError inside the worker.
        for f in hijacked:
            f.set_result("hijacked")
        return [x * 2 for x in items]

    svc, rec = services(Recorder(fn), max_size=2, max_wait_ms=10_000)
    rec.gate.clear()
    futs = svc.submit_many([1, 2])
    rec.wait_calls(1)
    hijacked.append(futs[0])
    rec.gate.set()
    assert futs[0].result(timeout=RESULT_TIMEOUT) == "hijacked"
    assert futs[1].result(timeout=RESULT_TIMEOUT) == 4
    hijacked.clear()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in svc.submit_many([3, 4])] == [6, 8]


@pytest.mark.timeout(30)
def test_future_resolved_elsewhere_while_queued_is_skipped(services):
    svc, rec = services(max_size=4, max_wait_ms=1)
    block_worker(svc, rec)
    futs = [svc.submit(i) for i in range(3)]
    futs[1].set_result("mine")  # Future.set_result is public; misuse must not kill the worker
    rec.gate.set()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in futs] == [0, "mine", 4]
    assert 1 not in rec.items_seen
    assert svc.submit(5).result(timeout=RESULT_TIMEOUT) == 10


# ------------------------------------------------------------ cancellation


@pytest.mark.timeout(30)
def test_cancelled_items_never_reach_batch_fn(services):
    svc, rec = services(max_size=8, max_wait_ms=5)
    block_worker(svc, rec)
    futs = [svc.submit(i) for i in range(6)]
    for i in (1, 3, 5):
        assert futs[i].cancel()
    # Cancelled futures are removed and notified at once: wait() sees them done.
    done, not_done = concurrent.futures.wait([futs[1], futs[3], futs[5]], timeout=1)
    assert len(done) == 3
    stats = svc.stats()
    assert stats.queue_depth == 3 and stats.cancelled_items_total == 3
    rec.gate.set()
    assert [futs[i].result(timeout=RESULT_TIMEOUT) for i in (0, 2, 4)] == [0, 4, 8]
    assert not {1, 3, 5} & set(rec.items_seen)
    assert rec.batches[1] == [0, 2, 4]
    stats = svc.stats()
    assert stats.cancelled_items_total == 3 and stats.items_total == 4  # blocker + 3


@pytest.mark.timeout(30)
def test_worker_skips_items_cancelled_after_eager_removal_lost_the_race(services, monkeypatch):
    # A cancel() can land after the worker has popped the item but before it
    # marks it running; then only the worker's own check keeps the item out of
    # batch_fn. Disable the eager removal (white-box) to make that path certain.
    svc, rec = services(max_size=8, max_wait_ms=5)
    monkeypatch.setattr(svc._queue, "_forget_if_cancelled", lambda fut: None)
    block_worker(svc, rec)
    futs = [svc.submit(i) for i in range(4)]
    assert futs[1].cancel() and futs[2].cancel()
    assert svc.stats().queue_depth == 4  # still queued: nobody removed them
    rec.gate.set()
    assert futs[0].result(timeout=RESULT_TIMEOUT) == 0
    assert futs[3].result(timeout=RESULT_TIMEOUT) == 6
    assert rec.batches[1] == [0, 3]
    # The worker notified the cancellations, so wait() sees them as done.
    done, _ = concurrent.futures.wait(futs[1:3], timeout=RESULT_TIMEOUT)
    assert len(done) == 2
    assert svc.stats().cancelled_items_total == 2


@pytest.mark.timeout(30)
def test_cancel_of_running_item_is_refused(services):
    svc, rec = services(max_size=1, max_wait_ms=0)
    fut = block_worker(svc, rec, item=7)
    assert fut.running()
    assert not fut.cancel()
    rec.gate.set()
    assert fut.result(timeout=RESULT_TIMEOUT) == 14
    assert svc.stats().cancelled_items_total == 0


@pytest.mark.timeout(30)
def test_cancelled_oldest_item_does_not_set_the_deadline(services):
    window = 0.3
    svc, rec = services(max_size=8, max_wait_ms=window * 1000)
    old = svc.submit("old")
    old.cancel()
    time.sleep(0.1)  # the input under test: the new item comes 100 ms after the cancelled one
    t0 = time.monotonic()
    new = svc.submit("new")
    assert new.result(timeout=RESULT_TIMEOUT) == "newnew"
    assert rec.batches == [["new"]]
    assert rec.starts[0] - t0 >= window - 0.002  # the new item's own window, not what was left of old's


# --------------------------------------------------------------- overload


@pytest.mark.timeout(30)
def test_overload_rejects_at_once_and_queued_items_still_resolve(services):
    svc, rec = services(max_size=2, max_wait_ms=1, max_queue=5, name="tiny")
    blocker = block_worker(svc, rec)
    queued = [svc.submit(i) for i in range(4)]
    # submit_many is all-or-nothing: 2 do not fit in the 1 free slot.
    with pytest.raises(Overloaded):
        svc.submit_many([100, 101])
    assert svc.stats().queue_depth == 4
    queued.append(svc.submit(4))
    t0 = time.monotonic()
    with pytest.raises(Overloaded) as info:
        svc.submit(5)
    assert time.monotonic() - t0 < 0.5
    assert "tiny" in str(info.value) and "max_queue=5" in str(info.value)
    assert info.value.retry_after_s > 0
    with pytest.raises(ValueError, match="max_queue is 5"):
        svc.submit_many(range(6))  # could never fit
    assert svc.submit_many([]) == []
    rec.gate.set()
    assert blocker.result(timeout=RESULT_TIMEOUT) == "blockerblocker"
    assert [f.result(timeout=RESULT_TIMEOUT) for f in queued] == [0, 2, 4, 6, 8]
    assert 100 not in rec.items_seen and 5 not in rec.items_seen
    # Capacity is back.
    assert svc.submit(6).result(timeout=RESULT_TIMEOUT) == 12


def test_overloaded_pickles_with_its_hint():
    err = pickle.loads(pickle.dumps(Overloaded("full", retry_after_s=2.5)))
    assert isinstance(err, Overloaded) and str(err) == "full" and err.retry_after_s == 2.5


# ------------------------------------------------------------------ close


@pytest.mark.timeout(30)
def test_close_finishes_queued_items_without_waiting_for_window(services):
    svc, rec = services(max_size=4, max_wait_ms=10_000)
    futs = [svc.submit(i) for i in range(10)]  # 4 + 4 full, then 2 in a window
    t0 = time.monotonic()
    svc.close()
    assert time.monotonic() - t0 < 2.0
    assert [f.result(timeout=0) for f in futs] == [2 * i for i in range(10)]
    assert sorted(rec.items_seen) == list(range(10))
    assert worker_thread(svc) is None
    with pytest.raises(ServiceClosed, match="closed"):
        svc.submit(1)
    svc.close()  # idempotent


@pytest.mark.timeout(30)
def test_close_waits_for_blocked_batch_and_rejects_new_items(services):
    svc, rec = services(max_size=2, max_wait_ms=1)
    blocker = block_worker(svc, rec)
    queued = [svc.submit(i) for i in range(3)]
    closer = threading.Thread(target=svc.close)
    closer.start()
    # While close() drains, new work is refused.

    def refused() -> bool:
        try:
            svc.submit("late").cancel()
        except ServiceClosed:
            return True
        return False

    wait_until(refused, RESULT_TIMEOUT, "close() never refused new items", poll_s=0.001)
    assert closer.is_alive()
    rec.gate.set()
    closer.join(RESULT_TIMEOUT)
    assert not closer.is_alive()
    assert blocker.result(timeout=0) == "blockerblocker"
    assert [f.result(timeout=0) for f in queued] == [0, 2, 4]


@pytest.mark.timeout(30)
def test_close_timeout_fails_queued_items_and_worker_exits_later(services):
    svc, rec = services(max_size=2, max_wait_ms=1, name="slow")
    blocker = block_worker(svc, rec)
    queued = [svc.submit(i) for i in range(3)]
    t0 = time.monotonic()
    svc.close(timeout=0.2)
    assert 0.2 - 0.01 <= time.monotonic() - t0 < 2.0
    for f in queued:
        with pytest.raises(ServiceClosed, match="shut down before this item ran"):
            f.result(timeout=0)
    assert not blocker.done()  # the running batch cannot be interrupted
    with pytest.raises(ServiceClosed):
        svc.submit(9)
    thread = worker_thread(svc)
    assert thread is not None and thread.is_alive() and thread.daemon
    rec.gate.set()
    assert blocker.result(timeout=RESULT_TIMEOUT) == "blockerblocker"
    thread.join(RESULT_TIMEOUT)
    assert not thread.is_alive()
    svc.close(timeout=RESULT_TIMEOUT)  # idempotent; returns at once now
    assert rec.items_seen == ["blocker"]
    stats = svc.stats()
    assert stats.failed_items_total == 3 and stats.queue_depth == 0


@pytest.mark.timeout(30)
def test_close_from_inside_batch_fn_does_not_deadlock(services):
    holder = {}

    def fn(items):
        holder["svc"].close()
        return items

    svc, _ = services(Recorder(fn), max_size=1, max_wait_ms=0)
    holder["svc"] = svc
    assert svc.submit("x").result(timeout=RESULT_TIMEOUT) == "x"
    with pytest.raises(ServiceClosed):
        svc.submit("y")


@pytest.mark.timeout(30)
def test_done_callback_may_submit_again(services):
    svc, _ = services(max_size=4, max_wait_ms=0)
    second = []
    chained = threading.Event()

    def again(fut):
        second.append(svc.submit(fut.result() + 1))
        chained.set()

    svc.submit(1).add_done_callback(again)
    assert chained.wait(RESULT_TIMEOUT)
    assert second[0].result(timeout=RESULT_TIMEOUT) == 6


# ------------------------------------------------------------ construction


def _fn(items):
    return items


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_size=0, max_wait_ms=1), "max_size"),
        (dict(max_size=-3, max_wait_ms=1), "max_size"),
        (dict(max_size=2.5, max_wait_ms=1), "max_size"),
        (dict(max_size=True, max_wait_ms=1), "max_size"),
        (dict(max_size=4, max_wait_ms=-1), "max_wait_ms"),
        (dict(max_size=4, max_wait_ms=float("nan")), "max_wait_ms"),
        (dict(max_size=4, max_wait_ms=float("inf")), "max_wait_ms"),
        (dict(max_size=4, max_wait_ms="5"), "max_wait_ms"),
        (dict(max_size=4, max_wait_ms=1, max_queue=0), "max_queue"),
        (dict(max_size=4, max_wait_ms=1, max_queue=None), "max_queue"),
    ],
)
def test_constructor_validation(kwargs, message):
    before = threading.active_count()
    with pytest.raises(ValueError, match=message):
        BatchingService("bad", _fn, **kwargs)
    assert threading.active_count() == before  # no thread leaked


def test_constructor_rejects_bad_name_and_fn():
    with pytest.raises(ValueError, match="callable"):
        BatchingService("bad", None, max_size=1, max_wait_ms=0)
    with pytest.raises(ValueError, match="name"):
        BatchingService("", _fn, max_size=1, max_wait_ms=0)


def test_properties_stats_snapshot_and_thread(services):
    svc, _ = services(name="embedder", max_size=3, max_wait_ms=7.5, max_queue=9)
    assert (svc.name, svc.max_size, svc.max_wait_ms) == ("embedder", 3, 7.5)
    thread = worker_thread(svc)
    assert thread is not None and thread.daemon and "embedder" in thread.name
    assert svc.submit(1).result(timeout=RESULT_TIMEOUT) == 2
    stats = svc.stats()
    assert isinstance(stats, BatchingStats)
    assert (stats.name, stats.max_size, stats.max_wait_ms, stats.max_queue) == (
        "embedder", 3, 7.5, 9,
    )
    assert stats.batches_total == 1 and stats.batch_size_counts == {1: 1}
    assert stats.wait_seconds_sum >= 0.007 - 0.002
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.items_total = 5  # type: ignore[misc]
    stats.batch_size_counts[99] = 1
    assert 99 not in svc.stats().batch_size_counts  # a copy, not the live dict
    assert "embedder" in repr(svc)


# ------------------------------------------------------- property-based


@settings(max_examples=25, deadline=None)
@given(
    items=st.lists(st.one_of(st.integers(0, 50), st.just(POISON)), min_size=1, max_size=12),
    max_size=st.integers(1, 5),
)
@pytest.mark.timeout(60)
def test_property_only_poison_items_fail(items, max_size):
    rec = Recorder(poison_fn)
    with BatchingService("prop", rec, max_size=max_size, max_wait_ms=1) as svc:
        futs = svc.submit_many(items)
        for item, fut in zip(items, futs):
            if item == POISON:
                with pytest.raises(ValueError):
                    fut.result(timeout=RESULT_TIMEOUT)
            else:
                assert fut.result(timeout=RESULT_TIMEOUT) == item * 2
    assert all(len(b) <= max_size for b in rec.batches)
    stats = svc.stats()
    assert stats.items_total == len(items)
    assert stats.failed_items_total == items.count(POISON)


# ----------------------------------------------------- close racing submit, abort, a dying worker
@pytest.mark.timeout(60)
def test_concurrent_submit_and_close_resolve_every_future_exactly_once():
    release = threading.Event()

    def slow(items):
        release.wait(5)
        return items

    def one_round(round_: int) -> None:
            svc = BatchingService(f"stress-{round_}", slow, max_size=4, max_wait_ms=1, max_queue=10_000)
            accepted, endings, lock = [], [], threading.Lock()
            start = threading.Barrier(9)

            def on_done(future):
                with lock:
                    endings.append(future)

            def client():
                start.wait()
                for i in range(300):
                    try:
                        future = svc.submit(i)
                    except ServiceClosed:
                        return
                    future.add_done_callback(on_done)
                    with lock:
                        accepted.append(future)
                    if i % 7 == 0:
                        future.cancel()

            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            start.wait()
            svc.close(timeout=0.01)  # some items still queued: they fail with ServiceClosed
            release.set()
            for t in threads:
                t.join(30)
            svc.close(timeout=30)
            release.clear()
            assert all(f.done() for f in accepted)
            assert sorted(map(id, endings)) == sorted(map(id, accepted))  # each future ended once
            outcomes = {"result": 0, "closed": 0, "cancelled": 0}
            for f in accepted:
                try:
                    f.result(timeout=0)
                    outcomes["result"] += 1
                except ServiceClosed:
                    outcomes["closed"] += 1
                except CancelledError:
                    outcomes["cancelled"] += 1
            st = svc.stats()
            assert st.items_total == outcomes["result"] and st.failed_items_total == outcomes["closed"]
            assert st.cancelled_items_total == outcomes["cancelled"] and st.queue_depth == 0

    for round_ in range(5):
        one_round(round_)


class Held:
    """A batch_fn that signals it has a batch (`entered`) and returns it once `gate` opens."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, items):
        self.entered.set()
        assert self.gate.wait(10)
        return items


@pytest.mark.timeout(30)
def test_batching_abort_fails_the_running_batch_and_the_queue_at_once():
    held = Held()
    gate, entered = held.gate, held.entered
    svc = BatchingService("search", held, max_size=1, max_wait_ms=0)
    running = svc.submit("a")
    assert entered.wait(10)
    queued = svc.submit("b")
    svc.abort("node 1 is stopping")
    for future in (running, queued):
        with pytest.raises(ServiceClosed, match="node 1 is stopping"):
            future.result(timeout=1)
    with pytest.raises(ServiceClosed):
        svc.submit("c")
    gate.set()  # batch_fn's late result finds its future failed: dropped, the thread ends
    svc.close(timeout=10)
    assert svc.failure is None


@pytest.mark.timeout(30)
def test_a_batching_worker_whose_cleanup_fails_dies_loudly_and_fails_what_it_holds(monkeypatch):
    fn = Held()
    gate, entered = fn.gate, fn.entered
    svc = BatchingService("rerank", fn, max_size=1, max_wait_ms=0)

    def broken(*_args):
        raise RuntimeError("bookkeeping failed")

    fail_held = svc._holdings.fail_held
    cleanups = []

    def cleanup_fails_once(make_error):  # the internal-error path's cleanup fails; the dying thread's works
        cleanups.append(make_error)
        if len(cleanups) == 1:
            broken()
        fail_held(make_error)

    monkeypatch.setattr(svc, "_run_batch", lambda batch: (fn(batch), broken()))  # a bug after batch_fn
    monkeypatch.setattr(svc._holdings, "fail_held", cleanup_fails_once)  # and its cleanup fails too
    running = svc.submit("a")
    assert entered.wait(10)
    queued = svc.submit("b")
    gate.set()
    for future in (running, queued):
        with pytest.raises(StageDown, match="rerank stage stopped: RuntimeError: bookkeeping failed"):
            future.result(timeout=10)
    assert svc.failure == "RuntimeError: bookkeeping failed"
    with pytest.raises(StageDown):
        svc.submit("c")
    svc.close(timeout=10)


# ------------------------------------------------------------ on_start

def test_on_start_runs_once_on_the_worker_before_its_first_batch(services):
    rec = Recorder()
    seen = []
    svc, _ = services(rec, max_size=2, max_wait_ms=0,
                      on_start=lambda: seen.append((threading.current_thread().name, len(rec.batches))))
    assert [f.result(timeout=RESULT_TIMEOUT) for f in svc.submit_many([1, 2, 3])] == [2, 4, 6]
    assert svc.submit(4).result(timeout=RESULT_TIMEOUT) == 8
    assert seen == [(f"batching-{svc.name}", 0)]


def test_an_on_start_that_raises_takes_the_stage_down_with_its_reason(services):
    def on_start():
        raise RuntimeError("no CUDA stream")
    svc, rec = services(on_start=on_start)
    with pytest.raises(StageDown, match="stage stopped: RuntimeError: no CUDA stream"):
        svc.submit(1).result(timeout=RESULT_TIMEOUT)  # refused at once, or failed where it was queued first
    assert rec.batches == []


# ------------------------------------------------------------ on_idle


class IdleCalls:
    """An on_idle that records the thread and queue depth of each call (-1: before `svc` is known) and
    signals every one."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.svc: BatchingService | None = None
        self._cond = threading.Condition()

    def __call__(self):
        with self._cond:
            self.calls.append((threading.current_thread().name, self.svc.stats().queue_depth if self.svc else -1))
            self._cond.notify_all()

    def wait_calls(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, RESULT_TIMEOUT), f"on_idle called {self.calls}"


@pytest.mark.timeout(30)
def test_on_idle_runs_on_the_worker_each_time_the_queue_drains_not_between_queued_batches(services):
    idle = IdleCalls()
    svc, rec = services(max_size=2, max_wait_ms=0, on_idle=idle)
    idle.svc = svc
    idle.wait_calls(1)  # at start: nothing queued
    first = block_worker(svc, rec)
    queued = svc.submit_many([1, 2, 3])  # wait behind the blocked batch: two batches more
    rec.gate.set()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in [first, *queued]] == ["blockerblocker", 2, 4, 6]
    idle.wait_calls(2)
    assert rec.batches == [["blocker"], [1, 2], [3]]
    # Once at start and once after [3], on the worker: never while [1, 2] or [3] waited their turn.
    assert [name for name, _ in idle.calls] == [f"batching-{svc.name}"] * 2 and idle.calls[1][1] == 0
    assert svc.submit(5).result(timeout=RESULT_TIMEOUT) == 10
    idle.wait_calls(3)
    assert len(idle.calls) == 3
