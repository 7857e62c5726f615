"""One Generator's model under continuous batching: `step()` = schedule -> execute -> update."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.continuous.output import Finish, finish_of
from pipeline.continuous.runner import ModelRunner
from pipeline.continuous.scheduler import Scheduler, SequenceState
from pipeline.continuous.slots import SlotRule, chunk_tokens


@dataclass
class StepResult:
    finished: list[SequenceState]
    failed: list[tuple[SequenceState, BaseException]]
    decoded_rows: int  # sequences that took a decode step this iteration
    admitted: list[SequenceState] = field(default_factory=list)  # given a slot this iteration
    tokens: list[tuple[SequenceState, int]] = field(default_factory=list)  # each token produced, in order


@dataclass(frozen=True)
class EngineStats:
    """What the engine holds now."""
    running_sequences: int = 0  # holding a slot (prefilling or decoding)
    waiting_sequences: int = 0  # added, waiting for a slot (sequence or KV budget)
    kv_tokens_in_use: int = 0  # cache columns held by the running rows (each slot's whole capacity)
    kv_tokens_reserved: int = 0  # prompt + max new tokens of every sequence holding a slot (admission counts
    # each slot as the slot rule lays them out: pipeline.continuous.slots.SlotRule)
    cuda_graphs_recorded: int = 0  # decode-step shapes replayed from a CUDA graph (0 off CUDA)
    cuda_graphs_failed: int = 0  # decode-step shapes whose recording failed twice: they run eagerly


class ContinuousEngine:
    def __init__(self, generator, *, max_batch: int = 8, kv_cache_tokens: int = 8192, prefill_chunk: int = 512):
        self.generator = generator
        config = generator.generation_config
        self.eos_ids = generator.eos_ids
        self.max_new_tokens = config.max_new_tokens
        rule = SlotRule(max_batch, kv_cache_tokens, chunk_tokens())
        self.scheduler = Scheduler(rule, prefill_chunk=prefill_chunk, eos_ids=self.eos_ids)
        self.runner = ModelRunner(generator.model, rule, repetition_penalty=config.repetition_penalty or 1.0,
                                  device=generator.placement.device)

    def add(self, request, payload: Any = None) -> SequenceState:
        """Queue a GenerationRequest: its max_new_tokens (None: the generation config's) caps the answer,
        its sampling (a pipeline.sampling_params.Sampling; None: greedy) picks the tokens (and, where it
        asks, each token's log probabilities go onto the request's `logprobs` list). Its stop strings
        are its output side's (pipeline/continuous/output.py), which cancels the sequence at one."""
        cap = self.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
        seq = self.scheduler.new_sequence(self.generator.request_ids(request), cap, payload)
        seq.sampling = request.sampling
        if request.sampling is not None and request.sampling.logprobs is not None:
            seq.logprobs = request.logprobs if request.logprobs is not None else []
        self.scheduler.add(seq)
        return seq

    def finish_of(self, seq: SequenceState) -> Finish:
        """How a sequence step() returned as finished ended: EOS or LENGTH (one cancelled ended ABORTED)."""
        return finish_of(seq.generated, self.eos_ids)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def sequences(self) -> list[SequenceState]:
        """Every sequence the engine holds, waiting or with a slot: the one record of them."""
        return self.scheduler.sequences()

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        return EngineStats(len(scheduler.active), len(scheduler.waiting), self.runner.cache_tokens(),
                           scheduler.tokens_reserved(), *self.runner.graph_counts())

    def warm_up(self, requests) -> list[SequenceState]:
        """Run GenerationRequests to their end, then (on CUDA) record the decode step of every shape the
        usual slot layout gives: what serving runs next is warm. Only on an idle engine; returns their
        sequences."""
        if self.has_work():
            raise RuntimeError("the engine warms up only while idle")
        seqs = [self.add(request) for request in requests]
        while self.has_work():
            failed = self.step().failed
            if failed:
                raise RuntimeError(f"warm-up failed: {failed[0][1]!r}") from failed[0][1]
        self.runner.record_graphs()
        return seqs

    def cancel(self, seq: SequenceState) -> None:
        """Abort a sequence wherever it is: it takes no further step and frees its slot."""
        self.scheduler.drop(seq)
        self.runner.release([seq.seq_id])

    def _hand_logprobs(self, appended: list[tuple[SequenceState, int]]) -> None:
        """Each new token's log probabilities (left on its row by the chooser) onto its sequence's list,
        before the step returns: a reader given a token finds its log probabilities there already."""
        table = self.runner.table
        for seq, _token in appended:
            if seq.logprobs is not None:
                seq.logprobs.append(table.rows[table.slot_of(seq.seq_id)].logprob)

    def step(self) -> StepResult:
        import torch
        plan = self.scheduler.plan()
        # Cache surgery and logits edits touch inference tensors: all of it inside.
        with torch.inference_mode():
            output = self.runner.execute(plan)
            update = self.scheduler.update_from_output(plan, output)
            self._hand_logprobs(update.appended)
            self.runner.release([s.seq_id for s in update.finished] + [s.seq_id for s, _ in update.failed])
        return StepResult(update.finished, update.failed, len(plan.decode), plan.admitted, update.appended)
