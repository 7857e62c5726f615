"""The slot table: every sequence holding a slot, its row, length, budget, seen tokens, sampling and K/V.

As vLLM v1's persistent input batch, one object holds all of it, indexed by slot: a sequence takes
the next slot when it is admitted, its prompt's chunks are written straight into its slot (from
column 0), each decode step writes one column per row at the row's own length, and a sequence that
leaves frees its slot, the last row moving into it, so the held rows are always slots [0, rows).

Every layer's keys and values (and the seen tokens) live in one buffer of GENERATE_KV_CACHE_TOKENS
columns, allocated once (at the first write: the engine's warm-up) and never reallocated. The buffer
is viewed as (slots, kv heads, capacity, head size); the layout, slots x capacity, is
:class:`SlotRule`'s, the one capacity rule (the scheduler admits by it): max_batch slots of an equal
share of the budget, or, while a longer sequence is held, fewer and longer slots, each as long as the
longest budget in whole attention chunks. A change of layout moves the held rows' columns within the
buffer (rare: only a sequence longer than the share changes it); the storage stays, so a CUDA graph
recorded for a layout replays again whenever that layout comes back.

A step reads slots [0, rows) over columns [0, width), width a whole number of attention chunks
covering the longest row; each row sees its columns up to its new token (:meth:`SlotTable.visible`)
and attention counts its key chunks from column 0 (pipeline.kernels.chunked_attention), so the row's
result is the one it would get alone, and a step's shapes are (rows, width) whatever the lengths,
which is what a CUDA graph replays (pipeline.continuous.cuda_graphs). Columns past a row's length hold
zeros or earlier keys: finite numbers, masked out, so they weigh exactly 0. Past a row's length its
seen tokens repeat its first token, which the repetition penalty counts anyway.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.kernels import huge_pages


def chunk_tokens() -> int:
    """The attention's chunk of keys (pipeline.kernels.chunked_attention.CHUNK), imported on first use:
    importing torch at module import would cost seconds."""
    from pipeline.kernels.chunked_attention import CHUNK
    return CHUNK


def chunks_for(columns: int) -> int:
    """Columns rounded up to whole attention chunks."""
    chunk = chunk_tokens()
    return -(-columns // chunk) * chunk


@dataclass(frozen=True)
class SlotRule:
    """How many slots of what length fit the KV budget: the one capacity rule, no tensors.

    max_batch: sequences holding a slot at once; kv_cache_tokens: the columns all slots take together;
    chunk: a slot's length is a whole number of these (the attention's chunk)."""
    max_batch: int
    kv_cache_tokens: int
    chunk: int = 1

    def __post_init__(self):
        if self.max_batch < 1 or self.kv_cache_tokens < 1 or self.chunk < 1:
            raise ValueError("max_batch, kv_cache_tokens and the slot chunk must be >= 1")

    def slot_length(self, budget_tokens: int) -> int:
        """A budget (prompt + max new tokens) rounded up to whole chunks."""
        return -(-budget_tokens // self.chunk) * self.chunk

    @property
    def base_capacity(self) -> int:
        """The slots' length while no longer sequence is held: max_batch equal shares of the budget."""
        return max(self.chunk, self.kv_cache_tokens // self.max_batch // self.chunk * self.chunk)

    def layout(self, budgets: Sequence[int] = ()) -> tuple[int, int]:
        """(slots, capacity) holding sequences of these budgets: slots as long as the share or the longest
        budget, as many as fit the KV budget (at most max_batch)."""
        capacity = max([self.base_capacity, *(self.slot_length(b) for b in budgets)])
        return min(self.max_batch, self.kv_cache_tokens // capacity), capacity

    def fits(self, budgets: Sequence[int]) -> bool:
        """Whether sequences of these budgets can hold a slot each at once."""
        return len(budgets) <= self.layout(budgets)[0]

    def admits(self, budget_tokens: int) -> bool:
        """Whether one sequence of this budget fits the KV budget at all."""
        return self.slot_length(budget_tokens) <= self.kv_cache_tokens


@dataclass(eq=False)
class SlotRow:
    """One held sequence: where it stands in its slot and how its tokens are chosen."""
    seq_id: int
    budget: int  # prompt + max new tokens: the columns it may fill
    length: int = 0  # columns its slot holds (prompt tokens prefilled, then one per decode step)
    decoding: bool = False  # its prompt is in: it takes a decode step each iteration
    sampling: Any = None  # its pipeline.sampling_params.Sampling (None: greedy)
    stream: Any = None  # its torch.Generator (sampled rows), seeded with the request's seed
    logprob: Any = None  # its last token's pipeline.continuous.sampling.TokenLogprob, where its sampling asks


@dataclass(eq=False)
class SlotTable:
    """The held sequences' slots, and the transformers cache protocol a forward pass over them needs.

    Duck-typed as a transformers cache: the model calls :meth:`update` once per layer with the pass's
    new keys and values; nothing else of a cache is used when the caller passes positions and the
    attention mask itself. A pass is a prefill chunk of one slot (:meth:`begin_prefill`) or a decode
    step of rows [0, rows) (:meth:`begin_step`)."""
    rule: SlotRule
    device: str = "cpu"
    rows: list[SlotRow] = field(default_factory=list)  # slot i holds rows[i]
    keys: dict[int, Any] = field(default_factory=dict)  # layer -> view (slots, kv heads, capacity, head size)
    values: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self):
        import torch
        self.torch = torch
        self.slots, self.capacity = self.rule.layout()
        self._storage: dict[int, tuple[Any, Any]] = {}  # layer -> flat keys and values buffers
        self._inner: dict[int, tuple[int, int]] = {}  # layer -> (kv heads, head size)
        self._seen_storage = torch.zeros(self.rule.kv_cache_tokens, dtype=torch.long, device=self.device)
        self.seen = self._view(self._seen_storage, ())  # (slots, capacity) token ids, aligned with the keys
        self._pass: tuple = ("idle",)
        # seq_id -> its slot, kept with `rows` by join and leave: a step finds its rows without a scan each.
        self._slot_by_seq: dict[int, int] = {}

    # ------------------------------------------------------------------ layout

    def _view(self, flat, inner: tuple[int, ...], layout: tuple[int, int] | None = None):
        """`flat` as (slots, *inner[:1], capacity, *inner[1:]) in `layout` (default: the current one)."""
        slots, capacity = layout or (self.slots, self.capacity)
        shape = (slots, *inner[:1], capacity, *inner[1:])
        size = 1
        for n in shape:
            size *= n
        return flat[:size].view(shape)

    def _relayout(self, slots: int, capacity: int) -> None:
        """Move the held rows' columns into a layout of `slots` x `capacity`, within the same buffers
        (one layer at a time: the copy in passing is one layer's rows)."""
        held, kept = len(self.rows), min(capacity, self.capacity)
        for layer, inner in self._inner.items():
            for views, flat in ((self.keys, self._storage[layer][0]), (self.values, self._storage[layer][1])):
                rows = views[layer][:held, :, :kept].clone()
                views[layer] = self._view(flat, inner, (slots, capacity))
                views[layer][:held, :, :kept].copy_(rows)
        seen, first = self.seen[:held, :kept].clone(), self.seen[:held, :1].clone()
        self.seen = self._view(self._seen_storage, (), (slots, capacity))
        self.seen[:held] = first  # new columns repeat each row's first token, as a join fills them
        self.seen[:held, :kept].copy_(seen)
        self.slots, self.capacity = slots, capacity

    # ------------------------------------------------------------------ rows

    def slot_of(self, seq_id: int) -> int:
        try:
            return self._slot_by_seq[seq_id]
        except KeyError:
            raise KeyError(f"sequence {seq_id} holds no slot") from None

    def holds(self, seq_id: int) -> bool:
        return seq_id in self._slot_by_seq

    def join(self, seq_id: int, prompt_ids: Sequence[int], budget: int, sampling: Any = None) -> int:
        """Give a sequence the next slot (the layout changes where the held ones and it do not fit);
        returns the slot. Its prompt is written by its prefill chunks."""
        budgets = [row.budget for row in self.rows] + [budget]
        if not self.rule.fits(budgets):
            raise RuntimeError(f"{len(budgets)} sequences of budgets {budgets} exceed the slot rule {self.rule}: "
                               f"the scheduler admitted past it")
        if len(budgets) > self.slots or self.rule.slot_length(budget) > self.capacity:
            self._relayout(*self.rule.layout(budgets))
        slot = len(self.rows)
        self.seen[slot].fill_(prompt_ids[0])
        self.seen[slot, :len(prompt_ids)].copy_(self.torch.tensor(list(prompt_ids), device=self.device))
        stream = None
        if sampling is not None and not sampling.greedy:
            stream = self.torch.Generator(device=self.device)
            stream.manual_seed(sampling.seed or 0)
        self.rows.append(SlotRow(seq_id, budget, sampling=sampling, stream=stream))
        self._slot_by_seq[seq_id] = slot
        return slot

    def leave(self, seq_id: int) -> None:
        """Free a sequence's slot (if it holds one): the last row moves into it."""
        if not self.holds(seq_id):
            return
        slot, last = self.slot_of(seq_id), len(self.rows) - 1
        if slot != last:
            columns = self.rows[last].length
            for t in (*self.keys.values(), *self.values.values()):
                t[slot, :, :columns].copy_(t[last, :, :columns])
            self.seen[slot].copy_(self.seen[last])
            self.rows[slot] = self.rows[last]
            self._slot_by_seq[self.rows[slot].seq_id] = slot
        self.rows.pop()
        del self._slot_by_seq[seq_id]

    def columns_held(self) -> int:
        """Cache columns the held rows take (rows x capacity, unused columns included)."""
        return len(self.rows) * self.capacity

    # ------------------------------------------------------------------ forward passes

    def begin_prefill(self, slot: int, start: int, end: int) -> None:
        """The next forward pass is prompt tokens [start, end) of the sequence in `slot`: their keys are
        written at columns [start, end) and the pass reads columns [0, end)."""
        self._pass = ("prefill", slot, start, end)

    def begin_step(self, columns, width: int) -> None:
        """The next forward pass is a decode step of rows [0, len(columns)), row r writing its new key
        at column columns[r] (a (rows,) int tensor) and reading columns [0, width)."""
        written = (self.torch.arange(columns.shape[0], device=columns.device), slice(None), columns)
        self._pass = ("step", columns.shape[0], width, written)

    def visible(self, columns, width: int):
        """Bool (rows, 1, 1, width): row r sees columns [0, columns[r]] (its keys and its new one)."""
        return (self.torch.arange(width, device=columns.device) <= columns[:, None])[:, None, None, :]

    def _allocate(self, layer: int, like) -> None:
        """The layer's buffers, once, shaped after its first keys (rows, kv heads, columns, head size)."""
        inner = (like.shape[1], like.shape[3])
        size = self.rule.kv_cache_tokens * inner[0] * inner[1]
        self._inner[layer] = inner
        self._storage[layer] = (self._zeros(size, like), self._zeros(size, like))
        self.keys[layer] = self._view(self._storage[layer][0], inner)
        self.values[layer] = self._view(self._storage[layer][1], inner)

    @staticmethod
    def _zeros(size: int, like):
        """A layer's flat keys or values, zeros: on the CPU in 2 MB pages where they are given (every step reads
        each row's keys so far from memory)."""
        if like.device.type != "cpu":
            return like.new_zeros(size)
        return huge_pages.empty((size,), like.dtype).zero_()

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the pass's new keys and values of layer `layer_idx` into their slots and return what the
        pass reads: views of the slots, (rows, kv heads, columns, head size)."""
        if layer_idx not in self.keys:
            self._allocate(layer_idx, key_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._pass[0] == "prefill":
            _, slot, start, end = self._pass
            keys[slot, :, start:end] = key_states[0]
            values[slot, :, start:end] = value_states[0]
            return keys[slot:slot + 1, :, :end], values[slot:slot + 1, :, :end]
        _, rows, width, written = self._pass
        keys[written] = key_states[:, :, 0]
        values[written] = value_states[:, :, 0]
        return keys[:rows, :, :width], values[:rows, :, :width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._pass[2] if self._pass[0] == "step" else self._pass[3] if self._pass[0] == "prefill" else 0
