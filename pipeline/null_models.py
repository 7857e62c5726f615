"""Null models (MODEL_SOURCE=null): a measurement mode, never a way to serve.

Every model stage is a stand-in of fixed, near-zero cost that still returns well-formed outputs of
the right shapes and types, so that what a request costs beyond its models' arithmetic can be timed
(profiling/overhead_floor.py, profiling/engine_overhead.py): batching, queues, the continuous
engine's scheduler, slots, runner, sampling and output processor, the HTTP hops, JSON and streaming
all run as they serve. What each stage returns:

* embed: a unit vector of the index's dimension, one of a fixed table picked by the text's crc32 (a
  course index, random vectors, accepts it; an index built by a real embedder refuses it by name);
* rerank: scores that keep retrieval order; sentiment and toxicity: fixed labels;
* generate: the real Generator (the stand-ins' tokenizer and generation config) over
  :class:`NullCausalLM`, whose forward picks the token of a fixed sentence at each row's position
  (one index into a precomputed one-hot table): never an end-of-sequence token, so every answer runs
  to its cap, as the random stand-ins' do.

No weights are read: the stand-ins' tokenizer and configs only (pipeline.models.null_source).
"""
from __future__ import annotations

import zlib
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from pipeline import spec
from pipeline.classifiers import ModerationText, SentimentClassifier, ToxicityClassifier
from pipeline.device import Placement
from pipeline.embedder import Embedder, unit_rows
from pipeline.generator import Generator
from pipeline.models import ModelSource
from pipeline.reranker import Reranker

NULL_PRECISION = "null"  # what /health's `device` shows for every null stage: "cpu/null"
# The null answer, cycled token by token.
NULL_ANSWER = ("Thank you for contacting us. Your request has been received and a member of our support "
               "team will follow up with the details shortly. ")
EMBED_TABLE_ROWS = 256  # distinct query vectors: searches do not all return the same documents
NULL_SENTIMENT = "neutral"
NULL_TOXIC = "false"


def null_placement(placement: Placement) -> Placement:
    """A stage's placement with its precision named `null`: /health's `device` says what runs."""
    return Placement(placement.device, "float32", NULL_PRECISION)


class NullEmbedder(Embedder):
    def __init__(self, placement: Placement, dim: int = spec.EMBED_DIM):
        # No model to read a dimension from: the contract's (a course build's vectors).
        super().__init__(None, null_placement(placement), dim=dim)
        rng = np.random.default_rng(0)
        self.table = unit_rows(rng.standard_normal((EMBED_TABLE_ROWS, dim)).astype(np.float32))

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [zlib.crc32(text.encode("utf-8", "surrogatepass")) % len(self.table) for text in texts]
        return self.table[rows]  # fancy indexing: a fresh (n, dim) array


class NullReranker(Reranker):
    def __init__(self, placement: Placement, tokenizer):
        # The stand-in's tokenizer: /v1/rerank bounds its documents in it.
        super().__init__(tokenizer, None, null_placement(placement))

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        # Decreasing: the stable sort keeps each request's documents in retrieval order.
        return [-float(i) for i in range(len(pairs))]


class NullSentiment(SentimentClassifier):
    def __init__(self, placement: Placement):
        super().__init__(None, None, null_placement(placement))

    def classify(self, texts: Sequence[str]) -> list[str]:
        return [NULL_SENTIMENT] * len(texts)

    __call__ = classify


class NullToxicity(ToxicityClassifier):
    def __init__(self, placement: Placement, tokenizer):
        # The stand-in's tokenizer: /v1/moderations bounds its texts in it.
        super().__init__(tokenizer, None, null_placement(placement))

    def classify(self, items: Sequence[Any]) -> list[Any]:
        # An answer gets the flag; a /v1/moderations text its (one, zero) label score.
        return [{"toxic": 0.0} if isinstance(item, ModerationText) else NULL_TOXIC for item in items]

    __call__ = classify


class NullCausalLM:
    """A causal LM as the continuous runner calls it, whose forward costs next to nothing: the logits of
    each row's last position are the one-hot row of `answer_ids[position % len(answer_ids)]`
    ((rows, 1, vocab) float32). As a CUDA graph's output, they are one buffer, valid until the next
    call: the runner takes its tokens from a forward's logits before the next forward. It reads no cache
    and writes none (the slot table still holds its rows)."""

    def __init__(self, answer_ids: Sequence[int], vocab_size: int, generation_config, device: str = "cpu"):
        import torch
        if not answer_ids or max(answer_ids) >= vocab_size:
            raise ValueError(f"answer ids must be non-empty and below the vocabulary ({vocab_size})")
        self.generation_config = generation_config
        self.device = device
        self.answer_ids = torch.tensor(list(answer_ids), device=device)
        self._logits = torch.zeros(0, vocab_size, device=device)

    def __call__(self, input_ids, position_ids, **_):
        import torch
        hot = self.answer_ids[position_ids[:, -1:] % self.answer_ids.shape[0]]
        rows = hot.shape[0]
        # One buffer, cleared whole (the runner penalizes logits in place) and set at one column a row:
        # gathering fresh one-hot rows, or zeroing fresh pages, costs 2-3 ms a step at 32 rows instead.
        if rows > self._logits.shape[0]:
            self._logits = torch.zeros(rows, self._logits.shape[1], device=self.device)
        logits = self._logits[:rows].zero_().scatter_(1, hot, 1.0)
        return SimpleNamespace(logits=logits.unsqueeze(1))

    def eval(self) -> NullCausalLM:
        return self


def null_generator(source: ModelSource, placement: Placement) -> Generator:
    """The real Generator (tokenizer, prompt, output side) over a NullCausalLM: the stand-ins' tokenizer
    and generation config, no weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    kwargs = source.hf_kwargs()
    tokenizer = AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, padding_side="left", **kwargs)
    config = AutoConfig.from_pretrained(spec.GENERATOR_MODEL, **kwargs)
    generation = GenerationConfig.from_pretrained(spec.GENERATOR_MODEL, **kwargs)
    answer = tokenizer.encode(NULL_ANSWER, add_special_tokens=False)
    model = NullCausalLM(answer, config.vocab_size, generation, placement.device)
    return Generator(tokenizer, model, null_placement(placement))


def load_null_models(source: ModelSource, place: Callable[[str], Placement]) \
        -> tuple[Embedder, Reranker, Generator, SentimentClassifier, ToxicityClassifier]:
    """The five null models in Stages' order: embedder, reranker, generator, sentiment, toxicity."""
    if not source.is_null:
        raise ValueError(f"null models are loaded only for MODEL_SOURCE=null, not {source.describe()}")
    from transformers import AutoTokenizer

    def tokenizer(name: str):
        return AutoTokenizer.from_pretrained(name, **source.hf_kwargs(name))

    return (NullEmbedder(place(spec.Stage.EMBED)),
            NullReranker(place(spec.Stage.RERANK), tokenizer(spec.RERANKER_MODEL)),
            null_generator(source, place(spec.Stage.GENERATE)), NullSentiment(place(spec.Stage.SENTIMENT)),
            NullToxicity(place(spec.Stage.TOXICITY), tokenizer(spec.TOXICITY_MODEL)))
