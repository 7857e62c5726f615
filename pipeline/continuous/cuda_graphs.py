"""A decode step captured once per shape as a CUDA graph, then replayed.

A decode step over the slot table (pipeline.continuous.slots) has the shapes (rows, width) whatever
the sequences' lengths, so its few thousand kernel launches are recorded once per shape and
replayed by one call. Rows are bucketed (:func:`bucket`): a batch runs as the smallest bucket that
holds it, its spare rows idle in free slots, which batch invariance leaves without effect on the others.

Replaying reads the step's inputs from the tensors it was recorded with, so each step copies its
token ids and columns into them; the graph writes the new keys and values into the slot table's
buffers, which are never reallocated, so a graph stays valid for as long as the engine lives. A
graph is keyed by the table's layout too (its slots' capacity: the strides it reads with), so the
graphs of one layout replay again when the table comes back to it. The engine records the whole
grid of its usual layout at warm-up (:meth:`DecodeGraphs.record`), before the service is ready.

A shape whose recording fails is tried once more; if that fails too, the failure is logged and
counted (:attr:`DecodeGraphs.failed`, exported as a metric) and that shape alone runs eagerly.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def bucket(rows: int, limit: int) -> int:
    """The rows a step of `rows` sequences runs as: 1, 2, 4, 8, then multiples of 8, at most `limit`."""
    size = 1
    while size < rows and size < 8:
        size *= 2
    if size < rows:
        size = -(-rows // 8) * 8
    return max(rows, min(size, limit))


def row_buckets(limit: int) -> list[int]:
    """Every row count :func:`bucket` gives for 1 .. `limit` rows."""
    return sorted({bucket(rows, limit) for rows in range(1, limit + 1)})


class DecodeGraphs:
    """CUDA graphs of one decode-step function, one per (layout, rows, width).

    `step(ids, columns, width)` -> logits is the eager step: (rows, 1) token ids and (rows,) columns
    in, (rows, vocab) logits out, with no host synchronisation inside (it is what gets recorded)."""

    def __init__(self, step: Callable[[Any, Any, int], Any]):
        import torch
        self.torch = torch
        self.step = step
        # (layout, rows, width) -> graph, ids, columns, logits
        self.graphs: dict[tuple[Any, int, int], tuple[Any, Any, Any, Any]] = {}
        self.eager: set[tuple[Any, int, int]] = set()  # shapes whose recording failed twice
        self.pool: Any = None

    @property
    def recorded(self) -> int:
        return len(self.graphs)

    @property
    def failed(self) -> int:
        return len(self.eager)

    def run(self, ids, columns, width: int, layout: Any = None):
        """The step's logits, from the recorded graph of its shape (recorded now on first use); a shape
        that cannot be recorded runs eagerly."""
        key = (layout, ids.shape[0], width)
        entry = None if key in self.eager else self.graphs.get(key) or self._record_or_count(key, ids, columns)
        if entry is None:
            return self.step(ids, columns, width)
        graph, static_ids, static_columns, logits = entry
        static_ids.copy_(ids)
        static_columns.copy_(columns)
        graph.replay()
        return logits

    def record(self, shapes, device, layout: Any = None) -> None:
        """Record the graph of every (rows, width) in `shapes` not recorded yet, with token 0 at column 0
        of every row: only while no sequence holds a slot (it writes into slots [0, rows))."""
        torch = self.torch
        for rows, width in shapes:
            key = (layout, rows, width)
            if key not in self.graphs and key not in self.eager:
                zeros = torch.zeros(rows, dtype=torch.long, device=device)
                self._record_or_count(key, zeros[:, None], zeros)

    def _record_or_count(self, key, ids, columns):
        """The shape's graph, recorded now (a second try where the first fails); None where both fail."""
        for attempt in (1, 2):
            try:
                entry = self.graphs[key] = self._record(ids, columns, key[2])
                return entry
            except Exception:  # an operation that cannot be captured, or a capture cut short
                log.exception("could not record the decode step of %d rows, %d columns as a CUDA graph (try %d "
                              "of 2)", key[1], key[2], attempt)
        log.error("decoding %d rows, %d columns eagerly: its CUDA graph could not be recorded", key[1], key[2])
        self.eager.add(key)
        return None

    def _record(self, ids, columns, width: int):
        torch = self.torch
        static_ids, static_columns = ids.clone(), columns.clone()
        # Warm up on a side stream, as torch.cuda.graphs asks: first calls allocate and pick kernels.
        # The warm-up runs this very step; the replay after recording writes the same keys again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step(static_ids, static_columns, width)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # The other stages run on the same GPU from their own threads while a step is recorded (on
        # torch's non-blocking side stream): only this thread's calls may break the recording.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = self.step(static_ids, static_columns, width)
        log.info("recorded a decode step as a CUDA graph: %d rows, %d columns", ids.shape[0], width)
        return graph, static_ids, static_columns, logits
