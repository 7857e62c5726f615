"""Continuous batching for the LLM: a scheduler that decides, a runner that executes.

As in vLLM's engine split, the `Scheduler` is plain bookkeeping (no tensors,
tested without a model) and the `ModelRunner` owns the model and the KV cache.
Each iteration: new sequences are prefilled alone (in chunks when long, so the
numbers match one-request-at-a-time generation exactly) and then join the
running batch; one decode step runs for every running sequence; a sequence
that finishes leaves at once.

The running batch keeps one left-padded KV cache; a joining sequence's cache is
padded to the batch's width (or the batch's to its), and columns that have
become padding in every row are trimmed when sequences leave.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

# ----------------------------------------------------------------------------- scheduling


@dataclass(eq=False)
class SequenceState:
    """One request's generation, as the scheduler sees it."""
    seq_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    payload: Any = None  # the caller's handle (a future); the scheduler never looks inside
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in this sequence's cache
    arrived_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None  # when the scheduler gave it a slot
    first_token_at: float | None = None
    finished: bool = False
    cache: Any = None  # the runner's per-sequence cache while prefilling

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def budget_tokens(self) -> int:
        """KV cache tokens this sequence may need at most."""
        return self.prompt_len + self.max_new_tokens

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.prompt_len


@dataclass
class StepPlan:
    prefill: list[tuple[SequenceState, int, int]]  # (sequence, start, end) prompt chunks to run now
    decode: list[SequenceState]  # running sequences that take one decode step


class Scheduler:
    """Admission and per-iteration plans; bounded by sequences and cache tokens."""

    def __init__(self, *, max_seqs: int, max_tokens: int, prefill_chunk: int):
        if max_seqs < 1 or max_tokens < 1 or prefill_chunk < 1:
            raise ValueError("max_seqs, max_tokens and prefill_chunk must be >= 1")
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[SequenceState] = deque()
        self.prefilling: list[SequenceState] = []
        self.running: list[SequenceState] = []
        self._ids = itertools.count()

    def new_sequence(self, prompt_ids: list[int], max_new_tokens: int, payload: Any = None) -> SequenceState:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) + max_new_tokens > self.max_tokens:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the "
                             f"{self.max_tokens}-token budget")
        return SequenceState(next(self._ids), list(prompt_ids), max_new_tokens, payload)

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    @property
    def active(self) -> list[SequenceState]:
        return self.prefilling + self.running

    def tokens_reserved(self) -> int:
        return sum(s.budget_tokens for s in self.active)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def plan(self) -> StepPlan:
        # Admit in arrival order while both budgets allow (no overtaking: fairness).
        while self.waiting and len(self.active) < self.max_seqs and \
                self.tokens_reserved() + self.waiting[0].budget_tokens <= self.max_tokens:
            seq = self.waiting.popleft()
            seq.admitted_at = time.monotonic()
            self.prefilling.append(seq)
        # Spend at most one chunk's worth of prompt tokens per iteration so the
        # running sequences' next token is never held up by more than that.
        chunks, budget = [], self.prefill_chunk
        for seq in self.prefilling:
            if budget <= 0:
                break
            end = min(seq.prompt_len, seq.prefilled + budget)
            chunks.append((seq, seq.prefilled, end))
            budget -= end - seq.prefilled
        return StepPlan(prefill=chunks, decode=list(self.running))

    def prefilled(self, seq: SequenceState, end: int) -> None:
        seq.prefilled = end

    def promote(self, seq: SequenceState, first_token: int, eos_ids: frozenset[int]) -> None:
        """The prompt is in: its first token is known and it joins the running batch."""
        self.prefilling.remove(seq)
        seq.first_token_at = time.monotonic()
        self._append(seq, first_token, eos_ids)
        if not seq.finished:
            self.running.append(seq)

    def advance(self, seqs: Sequence[SequenceState], tokens: Sequence[int], eos_ids: frozenset[int]) -> None:
        for seq, token in zip(seqs, tokens):
            self._append(seq, token, eos_ids)

    @staticmethod
    def _append(seq: SequenceState, token: int, eos_ids: frozenset[int]) -> None:
        seq.generated.append(token)
        if token in eos_ids or len(seq.generated) >= seq.max_new_tokens:
            seq.finished = True

    def drop(self, seq: SequenceState) -> None:
        """Remove a sequence wherever it is (finished, cancelled or failed)."""
        for group in (self.running, self.prefilling):
            if seq in group:
                group.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)

    def finished(self) -> list[SequenceState]:
        return [s for s in self.running if s.finished]


# ----------------------------------------------------------------------------- execution


class ModelRunner:
    """Owns the model and the running batch's KV cache; greedy with repetition penalty."""

    def __init__(self, model, *, eos_ids: Sequence[int], repetition_penalty: float = 1.0, device: str = "cpu"):
        import torch
        self.torch = torch
        self.model = model
        self.device = device
        self.eos_ids = frozenset(eos_ids)
        self.repetition_penalty = float(repetition_penalty)
        self.rows: list[SequenceState] = []  # running sequences, in cache row order
        self.cache = None  # DynamicCache of the running batch, left-padded
        self.mask = None  # (rows, width) attention mask of that cache

    # -- token choice, exactly as transformers' RepetitionPenaltyLogitsProcessor + greedy
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
        if seq.cache is None:
            seq.cache = DynamicCache()
        ids = torch.tensor([seq.prompt_ids[start:end]], device=self.device)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=seq.cache, use_cache=True, logits_to_keep=1)
        seq.cache = out.past_key_values
        if end < seq.prompt_len:
            return None
        return self._choose(out.logits[:, -1, :], [seq])[0]

    def join(self, seq: SequenceState) -> None:
        """Merge a fully prefilled sequence's cache into the running batch (left padding)."""
        torch = self.torch
        own_mask = torch.ones((1, seq.prompt_len), dtype=torch.long, device=self.device)
        if self.cache is None:
            self.cache, self.mask, self.rows = seq.cache, own_mask, [seq]
            seq.cache = None
            return
        width, own = self.mask.shape[1], seq.prompt_len
        for layer, new in zip(self.cache.layers, seq.cache.layers):
            layer.keys, layer.values = (self._cat_left_padded(a, b) for a, b in
                                        ((layer.keys, new.keys), (layer.values, new.values)))
        self.mask = self._cat_left_padded(self.mask, own_mask, dim=1, batch_dim=0)
        assert self.mask.shape[1] == max(width, own)
        self.rows.append(seq)
        seq.cache = None

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

    def decode(self) -> list[int]:
        """One step for every running sequence: feed its last token, get its next."""
        torch = self.torch
        ids = torch.tensor([[s.generated[-1]] for s in self.rows], device=self.device)
        positions = torch.tensor([[s.prompt_len + len(s.generated) - 1] for s in self.rows], device=self.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return self._choose(out.logits[:, -1, :], self.rows)

    def remove(self, seqs: Sequence[SequenceState]) -> None:
        """Drop rows of sequences that left, then trim columns that are padding everywhere."""
        gone = set(id(s) for s in seqs)
        keep = [i for i, s in enumerate(self.rows) if id(s) not in gone]
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


# ----------------------------------------------------------------------------- the engine


@dataclass
class StepResult:
    finished: list[SequenceState]
    failed: list[tuple[SequenceState, BaseException]]
    decoded_rows: int  # sequences that took a decode step this iteration


class ContinuousEngine:
    """Scheduler + runner for one Generator's model; one `step()` = one iteration."""

    def __init__(self, generator, *, max_seqs: int = 8, max_tokens: int = 8192, prefill_chunk: int = 512):
        self.generator = generator
        config = generator.generation_config
        eos = config.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
        self.max_new_tokens = config.max_new_tokens
        self.scheduler = Scheduler(max_seqs=max_seqs, max_tokens=max_tokens, prefill_chunk=prefill_chunk)
        self.runner = ModelRunner(generator.model, eos_ids=self.eos_ids,
                                  repetition_penalty=config.repetition_penalty or 1.0,
                                  device=generator.placement.device)

    def add_prompt(self, prompt: str, payload: Any = None, max_new_tokens: int | None = None) -> SequenceState:
        ids = self.generator.tokenizer(prompt)["input_ids"]
        seq = self.scheduler.new_sequence(ids, max_new_tokens or self.max_new_tokens, payload)
        self.scheduler.add(seq)
        return seq

    def add(self, request, payload: Any = None) -> SequenceState:
        return self.add_prompt(self.generator.prompt(request.query, request.documents), payload)

    def text(self, seq: SequenceState) -> str:
        return self.generator.tokenizer.decode(seq.generated, skip_special_tokens=True)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def cancel(self, seq: SequenceState) -> None:
        self.runner.remove([seq])
        self.scheduler.drop(seq)
        seq.cache = None

    def step(self) -> StepResult:
        import torch
        # Cache surgery and logits edits touch inference tensors: all of it inside.
        with torch.inference_mode():
            return self._step()

    def _step(self) -> StepResult:
        plan = self.scheduler.plan()
        finished: list[SequenceState] = []
        failed: list[tuple[SequenceState, BaseException]] = []
        for seq, start, end in plan.prefill:
            try:
                token = self.runner.prefill_chunk(seq, start, end)
            except Exception as exc:  # this prompt alone fails; the batch goes on
                self.cancel(seq)
                failed.append((seq, exc))
                continue
            self.scheduler.prefilled(seq, end)
            if token is None:
                continue
            self.scheduler.promote(seq, token, self.eos_ids)
            if seq.finished:
                seq.cache = None
                finished.append(seq)
            else:
                self.runner.join(seq)
        rows = list(self.runner.rows)
        if rows:
            try:
                tokens = self.runner.decode()
            except Exception as exc:  # a step failure leaves no sane cache: fail the batch
                for seq in rows:
                    self.cancel(seq)
                    failed.append((seq, exc))
                return StepResult(finished, failed, len(rows))
            self.scheduler.advance(rows, tokens, self.eos_ids)
            done = [s for s in rows if s.finished]
            self.runner.remove(done)
            for seq in done:
                self.scheduler.drop(seq)
            finished.extend(done)
        return StepResult(finished, failed, len(rows))
