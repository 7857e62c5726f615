"""What a stage's batches did: immutable counters the queue swaps under its lock, and the snapshot of them."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

# Upper bounds (seconds) of the queue-wait histogram: from a batch window's few milliseconds to a
# request's whole timeout spent queued.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def with_observations(counts: tuple[int, ...], bounds: tuple[float, ...], values) -> tuple[int, ...]:
    """Histogram counts (one per bound, plus one over the last) with `values` added."""
    updated = list(counts)
    for value in values:
        updated[bisect.bisect_left(bounds, value)] += 1
    return tuple(updated)


@dataclass(frozen=True)
class BatchCounters:
    """Immutable: the queue swaps in a new value under its lock, so a snapshot shares no state."""
    # Batches taken off the queue (one-by-one retries are part of their batch), so
    # sum(size * count) over batch_size_counts == items_total.
    batches_total: int = 0
    # Items taken off the queue to run (cancelled items are never counted).
    items_total: int = 0
    # Items whose future got an exception (the stage's error, or ServiceClosed).
    failed_items_total: int = 0
    # Items cancelled by their caller before they were taken off the queue.
    cancelled_items_total: int = 0
    # Batches whose items were retried one by one after the batch raised.
    retried_batches_total: int = 0
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    # Sum over items of the time from submit to being taken off the queue.
    wait_seconds_sum: float = 0.0
    # The same waits counted per WAIT_BUCKETS bound (+ one over the last), for the histogram.
    wait_bucket_counts: tuple[int, ...] = (0,) * (len(WAIT_BUCKETS) + 1)
    # Sum of the time the stage's thread spent computing.
    run_seconds_sum: float = 0.0
    max_batch_size_seen: int = 0

    def plus(self, **deltas: float) -> BatchCounters:
        return replace(self, **{name: getattr(self, name) + delta for name, delta in deltas.items()})

    def with_batch(self, waits: list[float]) -> BatchCounters:
        """One batch of len(waits) items taken off the queue, each having waited so long."""
        size = len(waits)
        sizes = dict(self.batch_size_counts)
        sizes[size] = sizes.get(size, 0) + 1
        return replace(self.plus(batches_total=1, items_total=size, wait_seconds_sum=sum(waits)),
                       batch_size_counts=sizes, max_batch_size_seen=max(self.max_batch_size_seen, size),
                       wait_bucket_counts=with_observations(self.wait_bucket_counts, WAIT_BUCKETS, waits))


@dataclass(frozen=True)
class BatchingStats(BatchCounters):
    """A consistent snapshot of a queue's counters (taken under its lock)."""
    name: str = ""
    max_size: int = 0
    max_wait_ms: float = 0.0
    max_queue: int = 0
    # Items accepted and still waiting to be taken off the queue.
    queue_depth: int = 0

    def summary(self) -> dict:
        return {"batches": self.batches_total, "items": self.items_total,
                "max_batch": self.max_batch_size_seen, "queue_depth": self.queue_depth}
