"""The running batch's KV cache: one preallocated slot per sequence, its keys from column 0.

Every layer holds keys and values of shape (slots, kv heads, capacity, head size), zeroed once:
a sequence's prompt is copied into its slot when it joins the batch, and a decode step writes one
column per row, at the row's own length. A step reads slots [0, rows) over columns [0, width),
width a whole number of attention chunks covering the longest row; each row sees its columns up
to its new token (:meth:`SlotCache.visible`), and attention counts its key chunks from column 0
(pipeline.kernels.chunked_attention), so the row's result is the one it would get alone, and a
step's shapes are (rows, width) whatever the lengths: the same shapes step after step, which is
what a CUDA graph replays (pipeline.continuous.cuda_graphs).

Columns past a row's length hold zeros or an earlier occupant's values: finite numbers, masked
out, so they weigh exactly 0. Every slot is as long as the longest sequence's budget in whole
chunks, and the slots together fit GENERATE_KV_CACHE_TOKENS (the scheduler admits by that rule), so
the cache's memory is bounded by that setting; it is reallocated (every layer copied once) only when
a joining sequence needs longer slots or more of them than it has.
"""
from __future__ import annotations

from typing import Any


def chunk_tokens() -> int:
    """The attention's chunk of keys (pipeline.kernels.chunked_attention.CHUNK), imported on first use:
    importing torch at module import would cost seconds."""
    from pipeline.kernels.chunked_attention import CHUNK
    return CHUNK


def chunks_for(columns: int) -> int:
    """Columns rounded up to whole attention chunks."""
    chunk = chunk_tokens()
    return -(-columns // chunk) * chunk


class SlotCache:
    """Per-layer key and value slots, and the transformers cache protocol a decode step needs.

    Duck-typed as a transformers cache: the model calls :meth:`update` once per layer with the
    step's new keys and values; nothing else of a cache is used when the caller passes positions and
    the attention mask itself."""

    def __init__(self, like_keys: list, slots: int, capacity: int):
        """`like_keys`: one tensor per layer (rows, kv heads, columns, head size), giving its
        dtype, device and shape."""
        import torch
        self.torch = torch
        self.keys = [k.new_zeros((slots, k.shape[1], capacity, k.shape[3])) for k in like_keys]
        self.values = [k.new_zeros((slots, k.shape[1], capacity, k.shape[3])) for k in like_keys]
        self._rows = 0
        self._width = 0
        self._written: Any = None  # the index of the column each row writes this step

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def resized(self, slots: int, capacity: int, rows: int) -> "SlotCache":
        """A cache of `slots` x `capacity` holding this one's first `rows` slots (their columns up to the
        smaller capacity: every row's length fits the new one)."""
        resized = SlotCache(self.keys, slots, capacity)
        width = min(capacity, self.capacity)
        for old, new in zip(self.keys + self.values, resized.keys + resized.values):
            new[:rows, :, :width].copy_(old[:rows, :, :width])
        return resized

    def store(self, slot: int, keys: list, values: list) -> None:
        """Put a sequence's cache (per layer (1, kv heads, length, head size)) in `slot`, from column 0."""
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.keys[layer][slot, :, :k.shape[2]].copy_(k[0])
            self.values[layer][slot, :, :v.shape[2]].copy_(v[0])

    def move(self, source: int, target: int, columns: int) -> None:
        """Copy the first `columns` of slot `source` into slot `target`."""
        for t in self.keys + self.values:
            t[target, :, :columns].copy_(t[source, :, :columns])

    def begin_step(self, columns, width: int) -> None:
        """The next forward pass is a decode step of rows [0, len(columns)), row r writing its new
        key at column columns[r] (a (rows,) int tensor) and reading columns [0, width)."""
        self._rows, self._width = columns.shape[0], width
        self._written = (self.torch.arange(columns.shape[0], device=columns.device), slice(None), columns)

    def visible(self, columns, width: int):
        """Bool (rows, 1, 1, width): row r sees columns [0, columns[r]] (its keys and its new one)."""
        return (self.torch.arange(width, device=columns.device) <= columns[:, None])[:, None, None, :]

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the step's new column of layer `layer_idx` (rows, kv heads, 1, head size) and return
        the keys and values the step reads: views of the slots, (rows, kv heads, width, head size)."""
        rows, width = self._rows, self._width
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self._written] = key_states[:, :, 0]
        values[self._written] = value_states[:, :, 0]
        return keys[:rows, :, :width], values[:rows, :, :width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._width
