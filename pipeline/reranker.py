"""Stage 4: cross-encoder reranking of (query, document) pairs (bge-reranker-base)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeline import spec
from pipeline.classifiers import SequenceClassifier
from pipeline.docstore import Document


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: tuple[Document, ...]


@dataclass(frozen=True)
class ScoredDocument:
    document: Document
    score: float


def length_groups(lengths: Sequence[int], max_pairs: int, max_pad_ratio: float) -> list[list[int]]:
    """Indices grouped into forwards: shortest first, a group closed when one more pair
    would exceed `max_pairs` or make its padded tokens (pairs x longest) more than
    `max_pad_ratio` x its real tokens. Padding is compute thrown away: one forward for
    a request's ten pairs of 89-262 tokens pads about a third on top."""
    groups: list[list[int]] = []
    group: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        padded = (len(group) + 1) * lengths[i]  # sorted: the new pair is the longest
        if group and (len(group) + 1 > max_pairs or padded > max_pad_ratio * (real + lengths[i])):
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real += lengths[i]
    if group:
        groups.append(group)
    return groups


class Reranker(SequenceClassifier):
    stage = spec.Stage.RERANK
    model_name = spec.RERANKER_MODEL
    # Pairs share a forward only while padding stays small (see length_groups).
    max_pairs_per_forward = 32
    max_pad_ratio = 1.1
    counts_tokens = True

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]):
        """Token ids of each (query, document) pair, truncated as the model reads them, unpadded."""
        return self.tokenizer([list(pair) for pair in pairs], truncation=True, max_length=spec.TRUNCATE_LENGTH)

    def pair_tokens(self, query: str, documents: Sequence[str]) -> list[int]:
        """Each (query, document) pair's length in this model's tokens, untruncated (at most
        spec.TRUNCATE_LENGTH fit its window); any thread may call it."""
        return [len(e.ids) for e in self._counter.encode_batch([(query, d) for d in documents])] if documents else []

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        if not pairs:
            return []
        encoded = self.encode_pairs(pairs)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        scores = [0.0] * len(pairs)
        for group in length_groups(lengths, self.max_pairs_per_forward, self.max_pad_ratio):
            inputs = self.tokenizer.pad({key: [encoded[key][i] for i in group] for key in encoded.keys()},
                                        return_tensors="pt")
            for i, score in zip(group, self.forward(inputs).view(-1).tolist()):
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
