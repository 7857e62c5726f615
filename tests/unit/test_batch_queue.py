"""services/stages/batch_queue.py, the queue policy alone under an injected clock (no thread, no sleep):
a window from the oldest item, a full batch at once, cancelled items, closing, capacity."""
from __future__ import annotations

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
