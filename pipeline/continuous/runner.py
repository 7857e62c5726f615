"""Executes a scheduler's plan: the model, and KV-cache tensors keyed by seq id.

The running batch keeps one left-padded KV cache; a sequence whose prompt is in
joins it at its first decode step (its own cache padded to the batch's width,
or the batch's to its), and columns that have become padding in every row are
trimmed when sequences leave. Token choice is greedy with the model's
repetition penalty, exactly as transformers' RepetitionPenaltyLogitsProcessor.
"""
from __future__ import annotations

from typing import Any, Sequence

from pipeline.continuous.scheduler import PrefillChunk, RunnerOutput, SchedulerOutput, SequenceState


class ModelRunner:
    def __init__(self, model, *, repetition_penalty: float = 1.0, device: str = "cpu"):
        import torch
        self.torch = torch
        self.model = model
        self.device = device
        self.repetition_penalty = float(repetition_penalty)
        self.rows: list[int] = []  # seq ids of the running batch, in cache row order
        self.cache = None  # DynamicCache of the running batch, left-padded
        self.mask = None  # (rows, width) attention mask of that cache
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

    def _choose(self, logits, seqs: Sequence[SequenceState]) -> list[int]:
        torch = self.torch
        logits = logits.float()
        if self.repetition_penalty != 1.0:
            for row, seq in enumerate(seqs):
                seen = torch.tensor(seq.prompt_ids + seq.generated, device=logits.device)
                score = logits[row].gather(0, seen)
                score = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
                logits[row].scatter_(0, seen, score)
        return logits.argmax(dim=-1).tolist()

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
        return self._choose(out.logits[:, -1, :], [seq])[0]

    def join(self, seq: SequenceState) -> None:
        """Merge a fully prefilled sequence's cache into the running batch (left padding)."""
        torch = self.torch
        own_cache = self._prefill_caches.pop(seq.seq_id)
        own_mask = torch.ones((1, seq.prompt_len), dtype=torch.long, device=self.device)
        if self.cache is None:
            self.cache, self.mask, self.rows = own_cache, own_mask, [seq.seq_id]
            return
        for layer, new in zip(self.cache.layers, own_cache.layers):
            layer.keys, layer.values = (self._cat_left_padded(a, b) for a, b in
                                        ((layer.keys, new.keys), (layer.values, new.values)))
        self.mask = self._cat_left_padded(self.mask, own_mask, dim=1, batch_dim=0)
        self.rows.append(seq.seq_id)

    def _cat_left_padded(self, a, b, dim: int = 2, batch_dim: int = 0):
        torch = self.torch
        wa, wb = a.shape[dim], b.shape[dim]
        if wa < wb:
            a = self._pad_left(a, wb - wa, dim)
        elif wb < wa:
            b = self._pad_left(b, wa - wb, dim)
        return torch.cat([a, b], dim=batch_dim)

    def _pad_left(self, t, n: int, dim: int):
        shape = list(t.shape)
        shape[dim] = n
        return self.torch.cat([t.new_zeros(shape), t], dim=dim)

    def decode(self, seqs: Sequence[SequenceState]) -> list[int]:
        """One step for every running sequence (given in row order): feed its last token, get its next."""
        torch = self.torch
        if [s.seq_id for s in seqs] != self.rows:
            raise RuntimeError(f"decode plan {[s.seq_id for s in seqs]} does not match the batch's rows {self.rows}")
        ids = torch.tensor([[s.generated[-1]] for s in seqs], device=self.device)
        positions = torch.tensor([[s.prompt_len + len(s.generated) - 1] for s in seqs], device=self.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(seqs), 1))], dim=1)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return self._choose(out.logits[:, -1, :], seqs)

    def release(self, seq_ids: Sequence[int]) -> None:
        """Free the tensors of sequences that left; trim columns that are padding in every row."""
        gone = set(seq_ids)
        for seq_id in gone:
            self._prefill_caches.pop(seq_id, None)
        keep = [i for i, seq_id in enumerate(self.rows) if seq_id not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            return
        index = self.torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask.index_select(0, index)
        first = int(self.mask.any(dim=0).nonzero()[0])
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def cache_tokens(self) -> int:
        """Cache slots held by the running batch (rows x width, padding included)."""
        return 0 if self.mask is None else int(self.mask.shape[0] * self.mask.shape[1])
