"""services/stages/batch_queue.py, the queue policy alone under an injected clock (no thread, no sleep):
a window from the oldest item, a full batch at once, cancelled items, closing, capacity."""
from __future__ import annotations

import threading

import pytest

from services.server.errors import Overloaded, ServiceClosed
from services.stages.batch_queue import BatchQueue
from tests.helpers import ManualClock


def test_window_starts_at_the_oldest_item_and_a_full_batch_goes_at_once():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=3, max_wait_ms=10, max_queue=10, clock=clock)
    assert q.due_in() is None
    q.put(["a"])
    clock.now += 0.004
    q.put(["b"])
    assert q.due_in() == pytest.approx(0.006)
    clock.now += 0.006
    assert q.due_in() == 0
    clock.now -= 0.006
    q.put(["c"])
    assert q.due_in() == 0  # full: no waiting on a full batch
    q.put(["d"])
    batch = q.take()
    assert [p.item for p in batch] == ["a", "b", "c"] and all(p.future.running() for p in batch)
    st = q.snapshot()
    assert st.batches_total == 1 and st.items_total == 3 and st.queue_depth == 1
    assert st.wait_seconds_sum == pytest.approx(0.004 + 0.0 + 0.0)


def test_cancelled_oldest_item_does_not_set_the_window_and_is_never_taken():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=4, max_wait_ms=10, max_queue=10, clock=clock)
    old = q.put(["old"])[0]
    clock.now += 0.008
    q.put(["new"])
    assert old.cancel()
    assert q.due_in() == pytest.approx(0.010)
    clock.now += 0.010
    assert [p.item for p in q.take()] == ["new"]
    assert q.snapshot().cancelled_items_total == 1


def test_closing_flushes_without_window_and_refuses_new_items():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=4, max_wait_ms=1000, max_queue=10, clock=clock)
    q.put([1, 2])
    q.close()
    assert q.due_in() == 0
    with pytest.raises(ServiceClosed):
        q.put([3])
    assert [p.item for p in q.next_batch()] == [1, 2]
    assert q.next_batch() is None  # closing and drained


def test_capacity_counts_busy_work_and_take_can_leave_futures_pending():
    q = BatchQueue("q", max_size=8, max_wait_ms=0, max_queue=3, clock=ManualClock(100.0))
    q.put([1])
    with pytest.raises(Overloaded) as info:
        q.put([2], busy=2, retry_after_s=lambda depth: 7.0)
    assert info.value.retry_after_s == 7.0
    batch = q.take(start_running=False)
    assert not batch[0].future.running() and batch[0].future.cancel()  # still the caller's to cancel


class Joinable:
    """A stand-in for the node's count of requests that may still submit to a stage."""

    def __init__(self, count: int):
        self.count = count

    def __call__(self) -> int:
        return self.count


def test_a_batch_nobody_else_may_join_is_due_at_once():
    q = BatchQueue("q", max_size=8, max_wait_ms=10_000, max_queue=10, clock=ManualClock(100.0),
                   may_join=Joinable(0))
    assert q.due_in() is None  # nothing queued: nothing due, whoever may come
    q.put(["lone"])
    assert q.due_in() == 0
    assert [p.item for p in q.take()] == ["lone"]


def test_a_batch_holds_its_window_while_someone_may_join_and_never_longer():
    clock = ManualClock(100.0)
    joinable = Joinable(2)
    q = BatchQueue("q", max_size=8, max_wait_ms=10, max_queue=10, clock=clock, may_join=joinable)
    q.put(["a"])
    assert q.due_in() == pytest.approx(0.010)
    clock.now += 0.004
    joinable.count = 1  # one of the two came (or left): the other may still come
    q.put(["b"])
    assert q.due_in() == pytest.approx(0.006)  # the window is the oldest item's, as without the count
    clock.now += 0.006
    assert q.due_in() == 0  # the window ends whoever may still come
    joinable.count = 0
    clock.now -= 0.005
    assert q.due_in() == 0  # the last one came: at once, before the window's end


def test_a_worker_waiting_out_a_window_closes_the_batch_when_the_last_joiner_leaves():
    joinable = Joinable(1)
    looked = threading.Event()

    def clock() -> float:  # read at put and, under the queue's lock, when the worker looks at its deadline
        looked.set()
        return 100.0

    q = BatchQueue("q", max_size=8, max_wait_ms=600_000, max_queue=10, clock=clock, may_join=joinable)
    q.put(["lone"])
    looked.clear()
    taken: list = []
    worker = threading.Thread(target=lambda: taken.extend(q.next_batch() or []), daemon=True)
    worker.start()
    assert looked.wait(30)  # the worker read its ten-minute deadline: someone may still join
    joinable.count = 0  # that request skipped the stage, failed or ended...
    q.wake()  # ...and its leaving wakes the queue (its lock: only once the worker waits)
    worker.join(30)
    woke = not worker.is_alive()
    q.close()  # frees a worker that missed the wake, so a failure here cannot hang the run
    assert woke and [p.item for p in taken] == ["lone"]
