"""Sequence-classification models: the base the reranker (stage 4) shares, and stages 6 and 7:
sentiment (five stars) and toxicity (six sigmoid labels).

Both classifiers read the response cut to 512 characters, as the reference did.
"""
from __future__ import annotations

from typing import Sequence

from pipeline import spec
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.models import ModelSource, resolve_model_source
from pipeline.precision import apply_precision


class SequenceClassifier:
    """A Hugging Face sequence-classification model and its tokenizer, in their placement."""
    stage = ""
    model_name = ""

    def __init__(self, tokenizer, model, placement: Placement):
        self.tokenizer = tokenizer
        self.model = model
        self.placement = placement

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


class ToxicityClassifier(_AnswerClassifier):
    stage = spec.Stage.TOXICITY
    model_name = spec.TOXICITY_MODEL

    def top_probabilities(self, texts: Sequence[str]) -> list[float]:
        # Multi-label: an independent sigmoid per label, as the pipeline applies it.
        return self.logits(texts).sigmoid().max(dim=-1).values.tolist() if texts else []

    def classify(self, texts: Sequence[str]) -> list[str]:
        return [spec.is_toxic_flag(p) for p in self.top_probabilities(texts)]

    __call__ = classify
