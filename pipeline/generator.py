"""Stage 5: the grounded answer from Qwen2.5-0.5B-Instruct, greedy, batched.

`generate` (the reference's) left-pads its batches with attention masks. A request's answer must not
depend on its batch-mates in any precision: attention runs each padded row over its own keys, and float
Linears run a lone row as a batch would (pipeline/kernels/batch_invariance.py, by apply_precision).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Sequence

from pipeline import spec
from pipeline.config import Settings
from pipeline.continuous.output import Completion, OutputProcessor, complete, finish_of
from pipeline.conversation import Conversation, build_messages
from pipeline.device import Placement, placement_for
from pipeline.models import ModelSource, resolve_model_source
from pipeline.precision import apply_precision
from pipeline.prompt_tokens import PromptTokenizer
from pipeline.sampling_params import Sampling


@dataclass(frozen=True)
class GenerationRequest:
    query: str
    documents: tuple  # reranked documents, best first; only the top 3 are used
    # New tokens at most; None: the generation config's (the contract's 128).
    max_new_tokens: int | None = None
    # Temperature, top_p, top_k, seed and stop strings (pipeline.sampling_params.Sampling); None: greedy.
    # Sampling is the continuous engine's; generate() (the reference's) is greedy. Stop strings are the
    # output side's, both ways (pipeline/continuous/output.py).
    sampling: Sampling | None = None
    # Called with each new token id as continuous batching produces it, on the engine's thread (a
    # stream's reader); not part of what is asked, so not of equality. generate() never calls it.
    on_token: Callable[[int], None] | None = field(default=None, compare=False, repr=False)
    # Where sampling asks for log probabilities, the list the continuous engine appends each new token's
    # (a TokenLogprob) to before its on_token call; None: the engine keeps them on its sequence.
    logprobs: list | None = field(default=None, compare=False, repr=False)
    # Earlier turns and the client's instructions (pipeline/conversation.py), fitted to their budget.
    conversation: Conversation | None = None
    # The prompt's ids (prompt_ids(query, documents, conversation)) where the caller encoded it already,
    # so that a request is encoded once (a worker's reply counts them); None: encoded where it is used.
    prompt_ids: tuple[int, ...] | None = field(default=None, compare=False, repr=False)


class Generator:
    stage = spec.Stage.GENERATE

    def __init__(self, tokenizer, model, placement: Placement, max_new_tokens: int = spec.MAX_NEW_TOKENS):
        # The one owner of the LLM's tokenization, for every thread (pipeline/prompt_tokens.py).
        self.tokens = PromptTokenizer(tokenizer)
        self.model = model
        self.placement = placement
        self.max_new_tokens = max_new_tokens
        # Greedy instead of the reference's temperature 0.01 sampling (the same
        # answer in all but name, and deterministic); the model's own repetition
        # penalty and eos ids stay as its generation config sets them.
        config = copy.deepcopy(model.generation_config)
        config.do_sample = False
        config.temperature = None
        config.top_p = None
        config.top_k = None
        config.max_new_tokens = max_new_tokens
        if config.pad_token_id is None:
            config.pad_token_id = tokenizer.pad_token_id
        self.generation_config = config

    @property
    def eos_ids(self) -> frozenset[int]:
        eos = self.generation_config.eos_token_id
        return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])

    @classmethod
    def load(cls, source: ModelSource, placement: Placement, **kwargs) -> "Generator":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, padding_side="left", **source.hf_kwargs(spec.GENERATOR_MODEL))
        model: Any = AutoModelForCausalLM.from_pretrained(spec.GENERATOR_MODEL, dtype=placement.torch_dtype,
                                                          **source.hf_kwargs(spec.GENERATOR_MODEL))
        model = apply_precision(model.to(placement.device).eval(), placement.precision)
        return cls(tokenizer, model, placement, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None) -> "Generator":
        source = source or resolve_model_source(settings)
        return cls.load(source, placement_for(settings, cls.stage))

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` adds to a prompt, as text (MAX_QUERY_TOKENS is checked with this)."""
        return self.tokens.count(text)

    def output(self, stops: Sequence[str] = (), abort: Callable[[], None] | None = None,
               tools_offered: bool = False, max_calls: int | None = None) -> OutputProcessor:
        """A new output processor for one sequence (any thread): `abort` ends it in the engine at a stop
        string (or where its last call allowed, `max_calls`, closes); where tools were offered, the
        model's tool calls are read as calls."""
        return OutputProcessor(self.tokens, stops, abort, self.tokens.tool_call_tokens if tools_offered else None,
                               max_calls)

    def completion(self, token_ids: Sequence[int], stops: Sequence[str] = (), tools_offered: bool = False) -> Completion:
        """The answer of a sequence run to its end (an end-of-sequence token or its cap), as its output
        processor makes it."""
        return complete(self.tokens, token_ids, finish_of(token_ids, self.eos_ids), stops,
                        self.tokens.tool_call_tokens if tools_offered else None)

    def prompt_ids(self, query: str, documents: Sequence, conversation: Conversation | None = None) -> list[int]:
        """The LLM prompt's token ids; the query's, the documents' and the conversation's text stays
        text (any thread)."""
        return self.tokens.prompt_ids(query, documents, conversation)

    def request_ids(self, request: GenerationRequest) -> list[int]:
        """A request's prompt ids: those it carries, else encoded now (any thread)."""
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        return self.prompt_ids(request.query, request.documents, request.conversation)

    def prompt(self, query: str, documents: Sequence, conversation: Conversation | None = None) -> str:
        """The prompt as text, for reading (the model gets prompt_ids)."""
        return self.tokens.render(build_messages(query, documents, conversation),
                                  conversation.tools if conversation else ())

    def generate_ids(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | None = None) -> list[list[int]]:
        """The new token ids of each prompt (its ids), up to and including its first eos."""
        import torch
        if not prompts:
            return []
        inputs = {k: v.to(self.placement.device) for k, v in self.tokens.left_padded(prompts).items()}
        extra = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        with torch.inference_mode():
            output = self.model.generate(**inputs, generation_config=self.generation_config, **extra)
        eos = self.eos_ids
        rows = []
        for row in output[:, inputs["input_ids"].shape[1]:].tolist():
            end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
            rows.append(row[:end])  # after eos a batch row holds only padding
        return rows

    def completions(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Each request's answer, text and finish reason (the reference's)."""
        if not requests:
            return []
        caps = [self.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens for r in requests]
        # One generate call runs until its longest answer ends, as with eos. Greedy
        # decoding makes a row's first n tokens the same whatever the call's cap,
        # so each answer is cut at its own cap afterwards.
        rows = self.generate_ids([self.request_ids(r) for r in requests], max_new_tokens=max(caps))
        return [self.completion(row[:cap], r.sampling.stop if r.sampling else (),
                                bool(r.conversation and r.conversation.tools))
                for row, cap, r in zip(rows, caps, requests)]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return [c.text for c in self.completions(requests)]

    __call__ = generate
