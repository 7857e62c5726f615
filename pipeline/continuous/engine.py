"""One Generator's model under continuous batching: `step()` = schedule -> execute -> update.

With the prefix cache on, the KV of the prompt's fixed head (Generator.prompt_head_ids) is
computed once per engine and copied into every sequence whose prompt ids start with it;
every such prompt's prefill is cut at the head's end, hit or miss, so a hit gives the same
logits, bit for bit, as a prefill that computes the head itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.continuous.runner import ModelRunner
from pipeline.continuous.scheduler import Scheduler, SequenceState
from pipeline.stop_strings import first_stop, truncate


@dataclass
class StepResult:
    finished: list[SequenceState]
    failed: list[tuple[SequenceState, BaseException]]
    decoded_rows: int  # sequences that took a decode step this iteration
    admitted: list[SequenceState] = field(default_factory=list)  # given a slot this iteration
    tokens: list[tuple[SequenceState, int]] = field(default_factory=list)  # each token produced, in order


@dataclass(frozen=True)
class EngineStats:
    """What the engine holds now, and its prefix cache's totals since it started (0 with the cache off)."""
    running_sequences: int = 0  # holding a slot (prefilling or decoding)
    waiting_sequences: int = 0  # added, waiting for a slot (sequence or KV budget)
    kv_tokens_in_use: int = 0  # cache slots of the running batch, padding included
    kv_tokens_reserved: int = 0  # prompt + max new tokens of every sequence holding a slot
    prefix_cache_hits_total: int = 0  # prefills that started from the cached head
    prefix_cache_misses_total: int = 0  # prefills that ran from token 0 (cache cold, or no head match)
    prefix_cache_tokens_saved_total: int = 0  # prompt tokens the hits did not run


class ContinuousEngine:
    def __init__(self, generator, *, max_seqs: int = 8, max_tokens: int = 8192, prefill_chunk: int = 512,
                 prefix_cache: bool = False):
        self.generator = generator
        config = generator.generation_config
        eos = config.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
        self.max_new_tokens = config.max_new_tokens
        self.scheduler = Scheduler(max_seqs=max_seqs, max_tokens=max_tokens, prefill_chunk=prefill_chunk,
                                   eos_ids=self.eos_ids,
                                   prefix_ids=generator.prompt_head_ids() if prefix_cache else (),
                                   stopped=self._reached_stop)
        self.runner = ModelRunner(generator.model, repetition_penalty=config.repetition_penalty or 1.0,
                                  device=generator.placement.device)

    def add_prompt(self, prompt: str, payload: Any = None, max_new_tokens: int | None = None,
                   sampling: Any = None) -> SequenceState:
        """sampling: a pipeline.sampling_params.Sampling (None: greedy, no stop strings)."""
        ids = self.generator.tokenizer(prompt)["input_ids"]
        cap = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        seq = self.scheduler.new_sequence(ids, cap, payload)
        seq.sampling = sampling
        self.scheduler.add(seq)
        return seq

    def add(self, request, payload: Any = None) -> SequenceState:
        """Queue a GenerationRequest; its max_new_tokens (None: the generation config's) caps the answer."""
        return self.add_prompt(self.generator.prompt(request.query, request.documents), payload,
                               request.max_new_tokens, getattr(request, "sampling", None))

    def text(self, seq: SequenceState) -> str:
        """The answer: its tokens' text, up to (not including) the first of its stop strings."""
        text = self.generator.tokenizer.decode(seq.generated, skip_special_tokens=True)
        return truncate(text, seq.sampling.stop) if seq.sampling is not None else text

    def _reached_stop(self, seq: SequenceState) -> bool:
        # The whole text each token (at most a few hundred tokens): a stop string may span tokens.
        if seq.sampling is None or not seq.sampling.stop:
            return False
        text = self.generator.tokenizer.decode(seq.generated, skip_special_tokens=True)
        return first_stop(text, seq.sampling.stop) is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def sequences(self) -> list[SequenceState]:
        """Every sequence the engine holds, waiting or with a slot: the one record of them."""
        return self.scheduler.sequences()

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        return EngineStats(len(scheduler.active), len(scheduler.waiting), self.runner.cache_tokens(),
                           scheduler.tokens_reserved(), scheduler.prefix_hits, scheduler.prefix_misses,
                           scheduler.prefix_tokens_saved)

    def cancel(self, seq: SequenceState) -> None:
        self.scheduler.drop(seq)
        self.runner.release([seq.seq_id])

    def step(self) -> StepResult:
        import torch
        plan = self.scheduler.plan()
        # Cache surgery and logits edits touch inference tensors: all of it inside.
        with torch.inference_mode():
            output = self.runner.execute(plan)
            update = self.scheduler.update_from_output(plan, output)
            self.runner.release([s.seq_id for s in update.finished] + [s.seq_id for s, _ in update.failed])
        return StepResult(update.finished, update.failed, len(plan.decode), plan.admitted, update.appended)
