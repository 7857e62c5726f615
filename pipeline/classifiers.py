"""Sequence-classification models: the base the reranker (stage 4) shares, and stages 6 and 7:
sentiment (five stars) and toxicity (six sigmoid labels).

Both classifiers read the response cut to 512 characters, as the reference did. The toxicity stage
also scores `ModerationText` items (/v1/moderations): read whole, within the model's 512-token
window (the route refuses a longer one), each label's probability returned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pipeline import spec
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.models import ModelSource, resolve_model_source
from pipeline.precision import apply_precision


class SequenceClassifier:
    """A Hugging Face sequence-classification model and its tokenizer, in their placement."""
    stage = ""
    model_name = ""

    counts_tokens = False  # keeps a counting copy of its tokenizer (a route bounds its client text by it)

    def __init__(self, tokenizer, model, placement: Placement):
        self.tokenizer = tokenizer
        self.model = model
        self.placement = placement
        # transformers' __call__ changes padding and truncation on the shared Rust tokenizer
        # (huggingface/transformers#47085), so request threads count with a copy set once and only read.
        self._counter: Any = _counting_copy(tokenizer) if self.counts_tokens else None

    @classmethod
    def load(cls, source: ModelSource, placement: Placement):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(cls.model_name, **source.hf_kwargs(cls.model_name))
        model = AutoModelForSequenceClassification.from_pretrained(
            cls.model_name, dtype=placement.torch_dtype, **source.hf_kwargs(cls.model_name))
        return cls(tokenizer, apply_precision(model.to(placement.device).eval(), placement.precision), placement)

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None):
        source = source or resolve_model_source(settings)
        return cls.load(source, placement_for(settings, cls.stage))

    def forward(self, inputs):
        """The model's logits for tokenized, padded inputs: float32, on the CPU."""
        import torch
        with torch.inference_mode():
            return self.model(**{k: v.to(self.placement.device) for k, v in inputs.items()}).logits.float().cpu()


def _counting_copy(tokenizer):
    from tokenizers import Tokenizer
    counter = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    counter.no_padding()
    counter.no_truncation()
    return counter


class _AnswerClassifier(SequenceClassifier):
    def logits(self, texts: Sequence[str]):
        return self.forward(self.tokenizer([spec.classifier_text(t) for t in texts], padding=True, truncation=True,
                                           max_length=spec.TRUNCATE_LENGTH, return_tensors="pt"))


class SentimentClassifier(_AnswerClassifier):
    stage = spec.Stage.SENTIMENT
    model_name = spec.SENTIMENT_MODEL

    def classify(self, texts: Sequence[str]) -> list[str]:
        if not texts:
            return []
        top = self.logits(texts).softmax(dim=-1).argmax(dim=-1).tolist()
        return [spec.sentiment_from_label(self.model.config.id2label[i]) for i in top]

    __call__ = classify


@dataclass(frozen=True)
class ModerationText:
    """A client's text to moderate: read whole (not cut to 512 characters as an answer is)."""
    text: str


class ToxicityClassifier(_AnswerClassifier):
    stage = spec.Stage.TOXICITY
    model_name = spec.TOXICITY_MODEL
    counts_tokens = True

    def top_probabilities(self, texts: Sequence[str]) -> list[float]:
        # Multi-label: an independent sigmoid per label, as the pipeline applies it.
        return self.logits(texts).sigmoid().max(dim=-1).values.tolist() if texts else []

    def count_tokens(self, text: str) -> int:
        """The text's length in this model's tokens, its special tokens included (at most
        spec.TRUNCATE_LENGTH fit its window); any thread may call it."""
        return len(self._counter.encode(text).ids)

    def label_scores(self, texts: Sequence[str]) -> list[dict[str, float]]:
        """Each text's probability per label (the model's id2label names), the text read whole."""
        if not texts:
            return []
        probabilities = self.forward(self.tokenizer(list(texts), padding=True, truncation=True,
                                                    max_length=spec.TRUNCATE_LENGTH, return_tensors="pt")).sigmoid()
        labels = [self.model.config.id2label[i] for i in range(probabilities.shape[-1])]
        return [dict(zip(labels, row)) for row in probabilities.tolist()]

    def classify(self, items: Sequence) -> list:
        """The stage's batch: an answer (a str) gets its flag, a ModerationText its label scores; each
        kind in a forward of its own, so an answer's forward is the one it had without them."""
        answers = [i for i, item in enumerate(items) if not isinstance(item, ModerationText)]
        texts = [i for i, item in enumerate(items) if isinstance(item, ModerationText)]
        results: list = [None] * len(items)
        flags = [spec.is_toxic_flag(p) for p in self.top_probabilities([items[i] for i in answers])]
        for i, result in zip(answers, flags):
            results[i] = result
        for i, scores in zip(texts, self.label_scores([items[i].text for i in texts])):
            results[i] = scores
        return results

    __call__ = classify
