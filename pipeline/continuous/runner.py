"""Executes a scheduler's plan: the model, and KV-cache tensors keyed by seq id.

The running batch keeps one left-padded KV cache; a sequence whose prompt is in
joins it at its first decode step (its own cache padded to the batch's width,
or the batch's to its), and columns that have become padding in every row are
trimmed when sequences leave. Token choice follows the model's repetition
penalty, exactly as transformers' RepetitionPenaltyLogitsProcessor, then is
greedy or sampled per row (pipeline/continuous/sampling.py).

A decode step does only the arithmetic that grows with the batch: the batch's
cache layers keep spare columns (a step writes one column in place instead of
DynamicLayer's torch.cat copying the whole cache in every layer), and the
tokens each row has seen are one (rows, width) tensor aligned with the cache,
so the repetition penalty is one batched gather/scatter rather than a tensor
built from Python lists for every row at every step.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from pipeline.continuous.sampling import TokenChooser
from pipeline.continuous.scheduler import PrefillChunk, RunnerOutput, SchedulerOutput, SequenceState

CACHE_ROOM = 128  # spare columns per rebuild of the batch cache: the contract's new tokens


@functools.cache
def roomy_layer_class():
    """RoomyLayer, defined on first use: importing transformers at module import would cost seconds.
    DynamicLayer's internals are among those pipeline.kernels.versions checks (ModelRunner does)."""
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        """A DynamicLayer whose keys/values are views of buffers with spare columns.

        `update` copies the step's new columns into the room (growing the buffers
        only when it runs out), so a step no longer copies the whole cache.
        The views hold the same values torch.cat would: attention sees the same numbers.
        """

        keys: Any  # tensors (DynamicLayer's own annotation allows None, which never holds here)
        values: Any

        def __init__(self, keys, values, room: int = CACHE_ROOM):
            super().__init__()
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.room = room
            self._store(keys, values)

        def _store(self, keys, values) -> None:
            width = keys.shape[2]
            self._keys = keys.new_empty((*keys.shape[:2], width + self.room, keys.shape[3]))
            self._values = values.new_empty((*values.shape[:2], width + self.room, values.shape[3]))
            self._keys[:, :, :width].copy_(keys)
            self._values[:, :, :width].copy_(values)
            self._view(width)

        def _view(self, width: int) -> None:
            self.keys, self.values = self._keys[:, :, :width], self._values[:, :, :width]

        def update(self, key_states, value_states, *args, **kwargs):
            width, new = self.keys.shape[2], key_states.shape[2]
            if width + new > self._keys.shape[2]:
                self._store(self.keys, self.values)
            self._keys[:, :, width:width + new].copy_(key_states)
            self._values[:, :, width:width + new].copy_(value_states)
            self._view(width + new)
            return self.keys, self.values

    return RoomyLayer


class ModelRunner:
    def __init__(self, model, *, repetition_penalty: float = 1.0, device: str = "cpu", cache_room: int = CACHE_ROOM):
        import torch

        from pipeline.kernels.versions import check_kernel_versions
        check_kernel_versions(device)  # before any cache layer subclasses DynamicLayer
        self.torch = torch
        self.model = model
        self.device = device
        self.repetition_penalty = float(repetition_penalty)
        self.cache_room = cache_room
        self.chooser = TokenChooser(device)
        self.rows: list[int] = []  # seq ids of the running batch, in cache row order
        # Typed Any: torch and transformers are imported on first use, not at module import.
        # None while no sequence runs.
        self.cache: Any = None  # DynamicCache of the running batch (RoomyLayer layers), left-padded
        self.mask: Any = None  # (rows, width) attention mask of that cache
        # (rows, width) token ids fed to the cache, column for column; a padding
        # column repeats the row's first token, which the penalty already counts.
        self.seen: Any = None
        self._prefill_caches: dict[int, Any] = {}  # seq id -> its own cache until it joins

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Decode the running batch, then run the prompt chunks.

        Decoding first lets a prompt finished in this plan join the batch at the
        next plan's decode, so the plan alone says who decodes; the order of
        forward passes over time is the same as prefill-then-decode.
        """
        out = RunnerOutput()
        if plan.decode:
            self._decode_step(plan.decode, out)
        for chunk in plan.prefill:
            self._prefill_step(chunk, out)
        return out

    def _decode_step(self, seqs: list[SequenceState], out: RunnerOutput) -> None:
        try:
            for seq in seqs:
                if seq.seq_id not in self.rows:
                    self.join(seq)
            tokens = self.decode(seqs)
        except Exception as exc:  # a step failure leaves no sane cache: the whole batch fails
            self.release(self.rows + [s.seq_id for s in seqs])
            out.failed.update((s.seq_id, exc) for s in seqs)
            return
        out.decoded.update(zip((s.seq_id for s in seqs), tokens))

    def _prefill_step(self, chunk: PrefillChunk, out: RunnerOutput) -> None:
        seq_id = chunk.seq.seq_id
        try:
            token = self.prefill_chunk(*chunk)
        except Exception as exc:  # this prompt alone fails; the batch goes on
            self.release([seq_id])
            out.failed[seq_id] = exc
            return
        out.prefilled[seq_id] = chunk.end
        if token is not None:
            out.first_tokens[seq_id] = token

    def _choose(self, logits, seen, seqs: Sequence[SequenceState] = ()) -> list[int]:
        """Each row's token (greedy or its own sampling) after the repetition penalty over `seen` (rows, k)
        token ids, repeats allowed: RepetitionPenaltyLogitsProcessor's gather/where/scatter, for all rows at once."""
        torch = self.torch
        logits = logits.float()
        if self.repetition_penalty != 1.0:
            score = logits.gather(1, seen)
            score = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
            logits.scatter_(1, seen, score)
        return self.chooser.choose(logits, seqs)

    def prefill_chunk(self, seq: SequenceState, start: int, end: int) -> int | None:
        """Run prompt tokens [start, end) of one sequence; the first new token when the prompt is done."""
        torch = self.torch
        from transformers import DynamicCache
        cache = self._prefill_caches.get(seq.seq_id) or DynamicCache()
        ids = torch.tensor([seq.prompt_ids[start:end]], device=self.device)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
        self._prefill_caches[seq.seq_id] = out.past_key_values
        if end < seq.prompt_len:
            return None
        return self._choose(out.logits[:, -1, :], torch.tensor([seq.prompt_ids], device=self.device), [seq])[0]

    def join(self, seq: SequenceState) -> None:
        """Merge a fully prefilled sequence's cache into the running batch (left padding)."""
        torch = self.torch
        own_cache = self._prefill_caches.pop(seq.seq_id)
        own_mask = torch.ones((1, seq.prompt_len), dtype=torch.long, device=self.device)
        own_seen = torch.tensor([seq.prompt_ids], device=self.device)  # what its cache holds
        if self.cache is None:
            self.cache, self.mask, self.seen, self.rows = own_cache, own_mask, own_seen, [seq.seq_id]
            self._relayer(lambda _n, keys, values: (keys, values))
            return
        own = own_cache.layers
        self._relayer(lambda n, keys, values: (self._cat_left_padded(keys, own[n].keys, dim=2),
                                               self._cat_left_padded(values, own[n].values, dim=2)))
        self.mask = self._cat_left_padded(self.mask, own_mask, dim=1)
        self.seen = self._cat_left_padded(self.seen, own_seen, dim=1, repeat_first=True)
        self.rows.append(seq.seq_id)

    def _relayer(self, fn) -> None:
        """Replace cache layer n by a RoomyLayer of fn(n, keys, values) -> (keys, values)."""
        layer_class, layers = roomy_layer_class(), self.cache.layers
        for n, layer in enumerate(layers):
            layers[n] = layer_class(*fn(n, layer.keys, layer.values), self.cache_room)

    def _cat_left_padded(self, a, b, dim: int, repeat_first: bool = False):
        """a and b stacked along dim 0, the narrower one padded on the left along dim."""
        wa, wb = a.shape[dim], b.shape[dim]
        if wa < wb:
            a = self._pad_left(a, wb - wa, dim, repeat_first)
        elif wb < wa:
            b = self._pad_left(b, wa - wb, dim, repeat_first)
        return self.torch.cat([a, b], dim=0)

    def _pad_left(self, t, n: int, dim: int, repeat_first: bool):
        """n columns before t along dim: zeros, or copies of the first column."""
        shape = list(t.shape)
        shape[dim] = n
        pad = t.narrow(dim, 0, 1).expand(shape) if repeat_first else t.new_zeros(shape)
        return self.torch.cat([pad, t], dim=dim)

    def decode(self, seqs: Sequence[SequenceState]) -> list[int]:
        """One step for every running sequence (given in row order): feed its last token, get its next."""
        torch = self.torch
        if [s.seq_id for s in seqs] != self.rows:
            raise RuntimeError(f"decode plan {[s.seq_id for s in seqs]} does not match the batch's rows {self.rows}")
        ids = torch.tensor([[s.generated[-1]] for s in seqs], device=self.device)
        positions = torch.tensor([[s.prompt_len + len(s.generated) - 1] for s in seqs], device=self.device)
        # Small (rows x width) tensors: growing them by cat costs microseconds, unlike the cache.
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(seqs), 1))], dim=1)
        self.seen = torch.cat([self.seen, ids], dim=1)  # now each row's prompt + generated
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return self._choose(out.logits[:, -1, :], self.seen, seqs)

    def release(self, seq_ids: Sequence[int]) -> None:
        """Free the tensors of sequences that left; trim columns that are padding in every row."""
        gone = set(seq_ids)
        self.chooser.release(list(gone))
        for seq_id in gone:
            self._prefill_caches.pop(seq_id, None)
        keep = [i for i, seq_id in enumerate(self.rows) if seq_id not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache, self.mask, self.seen = [], None, None, None
            return
        index = self.torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask.index_select(0, index)
        first = int(self.mask.any(dim=0).nonzero()[0])
        self.mask = self.mask[:, first:]
        self.seen = self.seen.index_select(0, index)[:, first:]
        self._relayer(lambda _n, keys, values: (keys.index_select(0, index)[:, :, first:],
                                                values.index_select(0, index)[:, :, first:]))

    def cache_tokens(self) -> int:
        """Cache slots held by the running batch (rows x width, padding included)."""
        return 0 if self.mask is None else int(self.mask.shape[0] * self.mask.shape[1])
