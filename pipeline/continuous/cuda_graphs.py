"""A decode step captured once per shape as a CUDA graph, then replayed.

A decode step over the slot cache (pipeline.continuous.slots) has the shapes (rows, width) whatever
the sequences' lengths, so its few thousand kernel launches are recorded once per shape and
replayed by one call. Rows are bucketed (:func:`bucket`): a batch runs as the smallest bucket that
holds it, its spare rows idle in free slots, which batch invariance leaves without effect on the others.

Replaying reads the step's inputs from the tensors it was recorded with, so each step copies its
token ids and columns into them; the graph writes the new keys and values into the slot cache
it was recorded against, so the graphs are dropped when the cache is reallocated (:meth:`clear`).
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


class DecodeGraphs:
    """CUDA graphs of one decode-step function, one per (rows, width).

    `step(ids, columns, width)` -> logits is the eager step: (rows, 1) token ids and (rows,) columns
    in, (rows, vocab) logits out, with no host synchronisation inside (it is what gets recorded)."""

    def __init__(self, step: Callable[[Any, Any, int], Any]):
        import torch
        self.torch = torch
        self.step = step
        self.graphs: dict[tuple[int, int], tuple[Any, Any, Any, Any]] = {}  # shape -> graph, ids, columns, logits
        self.pool: Any = None
        self.failed = False  # recording failed once: no more graphs

    def run(self, ids, columns, width: int):
        """The step's logits, from the recorded graph of its shape (recorded now on first use). Where
        recording fails (an operation that cannot be captured), every later step runs eagerly."""
        if self.failed:
            return self.step(ids, columns, width)
        key = (ids.shape[0], width)
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self.graphs[key] = self._record(ids, columns, width)
            except Exception:  # the eager step is the same arithmetic: serve on without graphs
                log.exception("could not record the decode step as a CUDA graph: decoding eagerly from now on")
                self.failed = True
                self.clear()
                return self.step(ids, columns, width)
        graph, static_ids, static_columns, logits = entry
        static_ids.copy_(ids)
        static_columns.copy_(columns)
        graph.replay()
        return logits

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

    def clear(self) -> None:
        """Forget every graph (the slot cache they write into was reallocated)."""
        self.graphs.clear()
        self.pool = None
