"""Admission, per-iteration plans and every sequence's state; no tensors, no model.

Each iteration a sequence is in one of three places: waiting for a slot,
prefilling its prompt (in chunks, so running sequences never wait for more than
one chunk's worth of prompt), or running (one decode step per iteration). A
sequence leaves the moment it finishes.

Prefix cache: given the token ids every prompt starts with (the system prompt and
template before the documents), a prompt that starts with exactly those ids is
always cut at the end of that head. The first such prefill to reach the cut has
the runner keep the head's KV; from then on a sequence's prefill starts at the
cut from a copy of it. A hit and a miss therefore run the same chunks past the
head, and the head's KV is the same numbers either way.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(eq=False)
class SequenceState:
    """One request's generation: the only copy of its state."""
    seq_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    payload: Any = None  # the caller's handle; the scheduler never looks inside
    sampling: Any = None  # its pipeline.sampling_params.Sampling (None: greedy); the runner reads it
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in this sequence's cache
    # Leading prompt tokens that are the scheduler's prefix (its ids exactly); 0: the prompt does not start with it.
    prefix_len: int = 0
    arrived_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None  # when the scheduler gave it a slot
    first_token_at: float | None = None
    finished: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def budget_tokens(self) -> int:
        """KV cache tokens this sequence may need at most."""
        return self.prompt_len + self.max_new_tokens


class PrefillChunk(NamedTuple):
    seq: SequenceState
    start: int  # prompt tokens [start, end) run this iteration
    end: int


@dataclass(frozen=True)
class SchedulerOutput:
    """One iteration's plan: all the runner needs to know."""
    prefill: list[PrefillChunk]
    decode: list[SequenceState]  # running sequences, each takes one decode step
    admitted: list[SequenceState] = field(default_factory=list)  # given a slot by this plan
    # Sequences whose cache starts as a copy of the runner's prefix KV; their chunk starts at prefix_len.
    prefix_hits: list[SequenceState] = field(default_factory=list)
    # The sequence whose cache, after its chunk (ending at prefix_len), the runner keeps as the prefix KV.
    prefix_store: SequenceState | None = None


@dataclass
class RunnerOutput:
    """What executing a plan produced, keyed by seq id."""
    prefilled: dict[int, int] = field(default_factory=dict)  # prompt tokens now in the sequence's cache
    first_tokens: dict[int, int] = field(default_factory=dict)  # for prompts completed this iteration
    decoded: dict[int, int] = field(default_factory=dict)  # the next token of each decoded sequence
    failed: dict[int, BaseException] = field(default_factory=dict)
    prefix_stored: bool = False  # the runner now holds the prefix KV (the plan's prefix_store ran)


@dataclass
class UpdateResult:
    finished: list[SequenceState]
    failed: list[tuple[SequenceState, BaseException]]
    appended: list[tuple[SequenceState, int]] = field(default_factory=list)  # each new token, in order


class Scheduler:
    """Bounded by sequences and cache tokens; admits in arrival order (no overtaking: fairness)."""

    def __init__(self, *, max_seqs: int, max_tokens: int, prefill_chunk: int,
                 eos_ids: frozenset[int] = frozenset(), clock: Callable[[], float] = time.monotonic,
                 prefix_ids: Sequence[int] = (), stopped: Callable[[SequenceState], bool] | None = None):
        """prefix_ids: the token ids every prompt is expected to start with, whose KV is computed once
        and reused (empty: no prefix cache, and prompts are cut only at multiples of prefill_chunk).
        stopped: whether a sequence's text has reached one of its stop strings (it then finishes)."""
        if max_seqs < 1 or max_tokens < 1 or prefill_chunk < 1:
            raise ValueError("max_seqs, max_tokens and prefill_chunk must be >= 1")
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.prefill_chunk = prefill_chunk
        self.eos_ids = frozenset(eos_ids)
        self._clock = clock
        self._stopped = stopped
        self.prefix_ids = list(prefix_ids)
        self.prefix_cached = False  # the runner holds the prefix's KV
        # Prefix cache totals: prefills that started from the prefix KV, prefills that started at
        # token 0 (the cache cold, or the prompt not starting with the prefix), prompt tokens not run.
        self.prefix_hits = 0
        self.prefix_misses = 0
        self.prefix_tokens_saved = 0
        self.waiting: deque[SequenceState] = deque()
        self.prefilling: list[SequenceState] = []
        self.running: list[SequenceState] = []
        self._ids = itertools.count()

    def new_sequence(self, prompt_ids: list[int], max_new_tokens: int, payload: Any = None) -> SequenceState:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt_ids) + max_new_tokens > self.max_tokens:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the "
                             f"{self.max_tokens}-token budget")
        return SequenceState(next(self._ids), list(prompt_ids), max_new_tokens, payload,
                             prefix_len=self.prefix_len_of(prompt_ids), arrived_at=self._clock())

    def prefix_len_of(self, prompt_ids: Sequence[int]) -> int:
        """len(prefix_ids) where the prompt starts with exactly those ids and goes on past them, else 0.

        Compared as ids: the same text can tokenize differently where BPE merges across the
        head's end. At least one token must follow: the last prompt token's logits give the first token."""
        n = len(self.prefix_ids)
        return n if 0 < n < len(prompt_ids) and list(prompt_ids[:n]) == self.prefix_ids else 0

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    @property
    def active(self) -> list[SequenceState]:
        return self.prefilling + self.running

    def sequences(self) -> list[SequenceState]:
        """Every sequence held: waiting, prefilling or running."""
        return list(self.waiting) + self.active

    def tokens_reserved(self) -> int:
        return sum(s.budget_tokens for s in self.active)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def plan(self) -> SchedulerOutput:
        admitted = []
        while self.waiting and len(self.active) < self.max_seqs and \
                self.tokens_reserved() + self.waiting[0].budget_tokens <= self.max_tokens:
            seq = self.waiting.popleft()
            seq.admitted_at = self._clock()
            self.prefilling.append(seq)
            admitted.append(seq)
        chunks, hits, store, budget = [], [], None, self.prefill_chunk
        for seq in self.prefilling:
            hit = seq.prefilled == 0 and seq.prefix_len > 0 and self.prefix_cached
            start = seq.prefix_len if hit else seq.prefilled
            end = self.chunk_end(seq, start)
            if end - start > budget:
                break  # its next whole chunk waits for the next iteration (the first always fits)
            chunks.append(PrefillChunk(seq, start, end))
            if hit:
                hits.append(seq)
            elif end == seq.prefix_len and not self.prefix_cached and store is None:
                store = seq
            budget -= end - start
        return SchedulerOutput(prefill=chunks, decode=list(self.running), admitted=admitted, prefix_hits=hits,
                               prefix_store=store)

    def chunk_end(self, seq: SequenceState, start: int) -> int:
        """Where the chunk of `seq` that starts at `start` ends: the next cut of its prompt.

        The cuts are the multiples of prefill_chunk and the end of its prefix, counted from its own
        start, whoever shares the iteration: where a chunk starts and ends changes its rounding (visibly
        in bfloat16), so a cut placed by another prompt's leftover budget would make the answer
        depend on company, and a cut only on a hit would make it depend on the cache."""
        end = min(seq.prompt_len, (start // self.prefill_chunk + 1) * self.prefill_chunk)
        return min(end, seq.prefix_len) if start < seq.prefix_len else end

    schedule = plan

    def update_from_output(self, plan: SchedulerOutput, output: RunnerOutput) -> UpdateResult:
        """The one place sequences change: tokens appended, prompts promoted, leavers dropped."""
        now = self._clock()
        failed, appended = [], []
        for seq in plan.decode + [chunk.seq for chunk in plan.prefill]:
            if seq.seq_id in output.failed:
                failed.append((seq, output.failed[seq.seq_id]))
                self.drop(seq)
        self.prefix_cached = self.prefix_cached or output.prefix_stored
        if self.prefix_ids:
            for seq, start, _end in plan.prefill:
                if seq.seq_id in output.failed:
                    continue
                if seq in plan.prefix_hits:
                    self.prefix_hits += 1
                    self.prefix_tokens_saved += seq.prefix_len
                elif start == 0:
                    self.prefix_misses += 1
        for seq in plan.decode:
            if seq.seq_id in output.decoded:
                self._append(seq, output.decoded[seq.seq_id])
                appended.append((seq, output.decoded[seq.seq_id]))
        for seq, _start, _end in plan.prefill:
            seq.prefilled = output.prefilled.get(seq.seq_id, seq.prefilled)
            if seq.seq_id in output.first_tokens:
                # The prompt is in: its first token is known and it joins the running batch.
                self.prefilling.remove(seq)
                seq.first_token_at = now
                self._append(seq, output.first_tokens[seq.seq_id])
                appended.append((seq, output.first_tokens[seq.seq_id]))
                self.running.append(seq)
        finished = [s for s in self.running if s.finished]
        for seq in finished:
            self.drop(seq)
        return UpdateResult(finished, failed, appended)

    def _append(self, seq: SequenceState, token: int) -> None:
        seq.generated.append(token)
        if token in self.eos_ids or len(seq.generated) >= seq.max_new_tokens or \
                (self._stopped is not None and self._stopped(seq)):
            seq.finished = True

    def drop(self, seq: SequenceState) -> None:
        """Remove a sequence wherever it is (finished, cancelled or failed)."""
        for group in (self.running, self.prefilling):
            if seq in group:
                group.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
