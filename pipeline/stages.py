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
from pipeline.spec import REFERENCE_QUERIES, Stage

# The warm-up asks what the course's client asks first: real input shapes, no made-up text.
WARMUP_QUERY = REFERENCE_QUERIES[0]
WARMUP_DOCUMENT = "Returns are accepted within 30 days."  # any text: only the shapes warm up
WARMUP_REPLY = "Thanks, that helped."


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
        """Each model where `placement(stage)` says; by default the settings' device, dtype and precision."""
        place = placement or (lambda stage: placement_for(settings, stage))
        return cls(
            embedder=Embedder.load(source, place(Stage.EMBED)),
            store=DocumentStore(settings.require_documents()),
            reranker=Reranker.load(source, place(Stage.RERANK)),
            generator=Generator.load(source, place(Stage.GENERATE)),
            sentiment=SentimentClassifier.load(source, place(Stage.SENTIMENT)),
            toxicity=ToxicityClassifier.load(source, place(Stage.TOXICITY)),
        )

    def warm_up(self) -> None:
        """One pass through every model so the first real request pays no lazy init."""
        self.embedder.embed([WARMUP_QUERY])
        self.reranker.score_pairs([(WARMUP_QUERY, WARMUP_DOCUMENT)])
        self.generator.generate_prompts([self.generator.prompt(WARMUP_QUERY, [])], max_new_tokens=2)
        self.sentiment.classify([WARMUP_REPLY])
        self.toxicity.classify([WARMUP_REPLY])

    def models(self) -> dict[Stage, Embedder | Reranker | Generator | SentimentClassifier | ToxicityClassifier]:
        """Each model stage's model, in MODEL_STAGES order."""
        return {Stage.EMBED: self.embedder, Stage.RERANK: self.reranker, Stage.GENERATE: self.generator,
                Stage.SENTIMENT: self.sentiment, Stage.TOXICITY: self.toxicity}

    def devices(self) -> dict[str, str]:
        return {str(stage): f"{model.placement.device}/{model.placement.precision}"
                for stage, model in self.models().items()}
