"""Admission, per-iteration plans and every sequence's state; no tensors, no model.

Each iteration a sequence is waiting for a slot, prefilling its prompt (in chunks, so running sequences
never wait for more than one chunk), or running (one decode step per iteration); it leaves once finished.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pipeline.continuous.slots import SlotRule


@dataclass(eq=False)
class SequenceState:
    """One request's generation: the only copy of its state."""
    seq_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    payload: Any = None  # the caller's handle; the scheduler never looks inside
    sampling: Any = None  # its pipeline.sampling_params.Sampling (None: greedy); the runner reads it
    logprobs: list | None = None  # its reader's list of each token's TokenLogprob, where sampling asks
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in this sequence's cache
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


@dataclass
class RunnerOutput:
    """What executing a plan produced, keyed by seq id."""
    prefilled: dict[int, int] = field(default_factory=dict)  # prompt tokens now in the sequence's cache
    first_tokens: dict[int, int] = field(default_factory=dict)  # for prompts completed this iteration
    decoded: dict[int, int] = field(default_factory=dict)  # the next token of each decoded sequence
    failed: dict[int, BaseException] = field(default_factory=dict)


@dataclass
class UpdateResult:
    finished: list[SequenceState]
    failed: list[tuple[SequenceState, BaseException]]
    appended: list[tuple[SequenceState, int]] = field(default_factory=list)  # each new token, in order


class Scheduler:
    """Bounded by the slot rule (sequences and cache tokens); admits in arrival order (no overtaking: fairness)."""

    def __init__(self, slots: SlotRule, *, prefill_chunk: int, eos_ids: frozenset[int] = frozenset(),
                 clock: Callable[[], float] = time.monotonic):
        """slots: the slot table's rule (pipeline/continuous/slots.py), which says how many sequences of
        what budgets (prompt + max new tokens) may hold a slot at once."""
        if prefill_chunk < 2:
            raise ValueError("prefill_chunk must be >= 2 (a chunk of one token attends as a decode step does)")
        self.slots = slots
        self.prefill_chunk = prefill_chunk
        self.eos_ids = frozenset(eos_ids)
        self._clock = clock
        self.waiting: deque[SequenceState] = deque()
        self.prefilling: list[SequenceState] = []
        self.running: list[SequenceState] = []
        self._ids = itertools.count()

    def new_sequence(self, prompt_ids: list[int], max_new_tokens: int, payload: Any = None) -> SequenceState:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not self.slots.admits(len(prompt_ids) + max_new_tokens):
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the "
                             f"{self.slots.kv_cache_tokens}-token KV-cache budget")
        return SequenceState(next(self._ids), list(prompt_ids), max_new_tokens, payload)

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    @property
    def active(self) -> list[SequenceState]:
        return self.prefilling + self.running

    def sequences(self) -> list[SequenceState]:
        """Every sequence held: waiting, prefilling or running."""
        return list(self.waiting) + self.active

    def tokens_reserved(self) -> int:
        """Prompt + max new tokens of every sequence holding a slot."""
        return sum(s.budget_tokens for s in self.active)

    @property
    def max_batch(self) -> int:
        return self.slots.max_batch

    def fits(self, joining: SequenceState) -> bool:
        """Whether `joining` can hold a slot beside the sequences holding one (the slot rule's say)."""
        return self.slots.fits([s.budget_tokens for s in self.active] + [joining.budget_tokens])

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def plan(self) -> SchedulerOutput:
        admitted = []
        while self.waiting and self.fits(self.waiting[0]):
            seq = self.waiting.popleft()
            self.prefilling.append(seq)
            admitted.append(seq)
        chunks: list[PrefillChunk] = []
        budget = self.prefill_chunk
        for seq in self.prefilling:
            start = seq.prefilled
            end = self.chunk_end(seq, start)
            if chunks and end - start > budget:
                break  # its next whole chunk waits for the next iteration (the first always runs)
            chunks.append(PrefillChunk(seq, start, end))
            budget -= end - start
        return SchedulerOutput(prefill=chunks, decode=list(self.running), admitted=admitted)

    def chunk_end(self, seq: SequenceState, start: int) -> int:
        """Where the chunk of `seq` that starts at `start` ends: the next cut of its prompt.

        The cuts are the multiples of prefill_chunk, counted from its own start, whoever shares the
        iteration: where a chunk starts and ends changes its rounding (visibly in bfloat16), so a cut
        placed by another prompt's leftover budget would make the answer depend on company. A last
        chunk of one token joins the chunk before it: one query attends as a decode step does
        (pipeline.kernels.chunked_attention), where the prompt alone gives its last token the prompt's
        attention; on CUDA the two kernels round apart."""
        end = min(seq.prompt_len, (start // self.prefill_chunk + 1) * self.prefill_chunk)
        return seq.prompt_len if seq.prompt_len - end == 1 else end

    def update_from_output(self, plan: SchedulerOutput, output: RunnerOutput) -> UpdateResult:
        """The one place sequences change: tokens appended, prompts promoted, leavers dropped."""
        now = self._clock()
        failed = []
        appended: list[tuple[SequenceState, int]] = []
        for seq in plan.decode + [chunk.seq for chunk in plan.prefill]:
            if seq.seq_id in output.failed:
                failed.append((seq, output.failed[seq.seq_id]))
                self.drop(seq)
        for seq in plan.decode:
            if seq.seq_id in output.decoded:
                self._append(seq, output.decoded[seq.seq_id], appended)
        for seq, _start, _end in plan.prefill:
            seq.prefilled = output.prefilled.get(seq.seq_id, seq.prefilled)
            if seq.seq_id in output.first_tokens:
                # The prompt is in: its first token is known and it joins the running batch.
                self.prefilling.remove(seq)
                seq.first_token_at = now
                self._append(seq, output.first_tokens[seq.seq_id], appended)
                self.running.append(seq)
        finished = [s for s in self.running if s.finished]
        for seq in finished:
            self.drop(seq)
        return UpdateResult(finished, failed, appended)

    def _append(self, seq: SequenceState, token: int, appended: list[tuple[SequenceState, int]]) -> None:
        seq.generated.append(token)
        appended.append((seq, token))
        if token in self.eos_ids or len(seq.generated) >= seq.max_new_tokens:
            seq.finished = True

    def drop(self, seq: SequenceState) -> None:
        """Remove a sequence wherever it is (finished, cancelled or failed)."""
        for group in (self.running, self.prefilling, self.waiting):
            if seq in group:
                group.remove(seq)
