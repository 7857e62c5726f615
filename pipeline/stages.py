"""The five models and the document store, loaded together (no threads, no HTTP)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.docstore import DocumentStore
from pipeline.embedder import Embedder
from pipeline.generator import Generator
from pipeline.models import ModelSource
from pipeline.reranker import Reranker

WARMUP_QUERY = "How do I return a defective product?"


@dataclass
class Stages:
    """The models and the document store of one pipeline: a worker's, or the reference's."""
    embedder: Embedder
    store: DocumentStore
    reranker: Reranker
    generator: Generator
    sentiment: SentimentClassifier
    toxicity: ToxicityClassifier

    @classmethod
    def load(cls, settings: Settings, source: ModelSource,
             placement: Callable[[str], Placement] | None = None) -> "Stages":
        """Each model where `placement(stage)` says; by default the settings' device and dtype."""
        place = placement or (lambda stage: placement_for(settings, stage))
        return cls(
            embedder=Embedder.load(source, place("embed")),
            store=DocumentStore(settings.require_documents()),
            reranker=Reranker.load(source, place("rerank")),
            generator=Generator.load(source, place("generate")),
            sentiment=SentimentClassifier.load(source, place("sentiment")),
            toxicity=ToxicityClassifier.load(source, place("toxicity")),
        )

    def warm_up(self) -> None:
        """One pass through every model so the first real request pays no lazy init."""
        self.embedder.embed([WARMUP_QUERY])
        self.reranker.score_pairs([(WARMUP_QUERY, "Returns are accepted within 30 days.")])
        self.generator.generate_prompts([self.generator.prompt(WARMUP_QUERY, [])], max_new_tokens=2)
        self.sentiment.classify(["Thanks, that helped."])
        self.toxicity.classify(["Thanks, that helped."])

    def devices(self) -> dict[str, str]:
        return {name: f"{stage.placement.device}/{stage.placement.dtype}"
                for name, stage in (("embed", self.embedder), ("rerank", self.reranker),
                                    ("generate", self.generator), ("sentiment", self.sentiment),
                                    ("toxicity", self.toxicity))}
