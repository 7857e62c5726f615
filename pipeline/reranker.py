"""Stage 4: cross-encoder reranking of (query, document) pairs (bge-reranker-base)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeline import spec
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.docstore import Document
from pipeline.models import ModelSource, resolve_model_source


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: tuple[Document, ...]


@dataclass(frozen=True)
class ScoredDocument:
    document: Document
    score: float


class Reranker:
    stage = "rerank"

    def __init__(self, tokenizer, model, placement: Placement, max_pairs_per_forward: int = 32):
        self.tokenizer = tokenizer
        self.model = model
        self.placement = placement
        # Pairs of several requests share forwards; sorting by length keeps padding low.
        self.max_pairs_per_forward = max_pairs_per_forward

    @classmethod
    def load(cls, source: ModelSource, placement: Placement) -> "Reranker":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(spec.RERANKER_MODEL, **source.hf_kwargs())
        model = AutoModelForSequenceClassification.from_pretrained(
            spec.RERANKER_MODEL, dtype=placement.torch_dtype, **source.hf_kwargs())
        return cls(tokenizer, model.to(placement.device).eval(), placement)

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None) -> "Reranker":
        source = source or resolve_model_source(settings)
        return cls.load(source, placement_for(settings, cls.stage))

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch
        if not pairs:
            return []
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        scores = [0.0] * len(pairs)
        with torch.inference_mode():
            for start in range(0, len(order), self.max_pairs_per_forward):
                chunk = order[start:start + self.max_pairs_per_forward]
                inputs = self.tokenizer([list(pairs[i]) for i in chunk], padding=True, truncation=True,
                                        max_length=spec.TRUNCATE_LENGTH, return_tensors="pt")
                inputs = {k: v.to(self.placement.device) for k, v in inputs.items()}
                logits = self.model(**inputs).logits.view(-1).float().cpu().tolist()
                for i, score in zip(chunk, logits):
                    scores[i] = score
        return scores

    def rerank(self, requests: Sequence[RerankRequest]) -> list[list[ScoredDocument]]:
        pairs = [(r.query, d.content) for r in requests for d in r.documents]
        scores = iter(self.score_pairs(pairs))
        results = []
        for request in requests:
            scored = [ScoredDocument(d, next(scores)) for d in request.documents]
            # Stable sort: equal scores keep retrieval order, deterministically.
            results.append(sorted(scored, key=lambda s: -s.score))
        return results

    __call__ = rerank
