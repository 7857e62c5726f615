"""The five models of one pipeline, loaded together (no threads, no HTTP)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.embedder import Embedder
from pipeline.generator import GenerationRequest, Generator
from pipeline.models import ModelSource
from pipeline.reranker import Reranker
from pipeline.spec import REFERENCE_QUERIES, Stage

if TYPE_CHECKING:
    from pipeline.continuous import ContinuousEngine

# The warm-up asks what the course's client asks first: real input shapes, no made-up text.
WARMUP_QUERY = REFERENCE_QUERIES[0]
WARMUP_DOCUMENT = "Returns are accepted within 30 days."  # any text: only the shapes warm up
WARMUP_REPLY = "Thanks, that helped."


def release_freed_memory() -> None:
    """Give the heap freed by a model's load (its float weights, once converted) back to the OS: glibc
    keeps freed blocks below its mmap threshold, so each load would stack on the last one's leftovers.
    Not glibc (musl, macOS): nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Stages:
    """The models of one pipeline: a worker's, or the reference's. Documents are not among them: a
    worker fetches from the data version each request holds (services.roles.versioned_data)."""
    embedder: Embedder
    reranker: Reranker
    generator: Generator
    sentiment: SentimentClassifier
    toxicity: ToxicityClassifier

    @classmethod
    def load(cls, settings: Settings, source: ModelSource,
             placement: Callable[[str], Placement] | None = None) -> "Stages":
        """Each model where `placement(stage)` says; by default the settings' device, dtype and precision."""
        place = placement or (lambda stage: placement_for(settings, stage))
        if source.is_null:  # a measurement mode (pipeline/null_models.py): announced loudly by pipeline.models
            from pipeline.null_models import load_null_models
            return cls(*load_null_models(source, place))

        def load(model_class, **options):
            model = model_class.load(source, place(model_class.stage), **options)
            release_freed_memory()
            return model

        # The LLM first: its load holds the float checkpoint and the converted copy at once (about
        # 1.3 GB over its final size on the faithful stand-ins), best paid while the process is small.
        generator = load(Generator)
        return cls(embedder=load(Embedder, name=settings.embed.model), reranker=load(Reranker), generator=generator,
                   sentiment=load(SentimentClassifier), toxicity=load(ToxicityClassifier))

    def warm_up(self, engine: ContinuousEngine) -> None:
        """One pass through every model so the first real request pays no lazy init; the LLM's through
        `engine`, the continuous engine that will serve it (idle; on CUDA every decode-step graph of its
        usual slot layout is recorded)."""
        self.embedder.embed([WARMUP_QUERY])
        self.reranker.score_pairs([(WARMUP_QUERY, WARMUP_DOCUMENT)])
        engine.warm_up([GenerationRequest(WARMUP_QUERY, (), max_new_tokens=2)])
        self.sentiment.classify([WARMUP_REPLY])
        self.toxicity.classify([WARMUP_REPLY])

    def models(self) -> dict[Stage, Embedder | Reranker | Generator | SentimentClassifier | ToxicityClassifier]:
        """Each model stage's model, in MODEL_STAGES order."""
        return {Stage.EMBED: self.embedder, Stage.RERANK: self.reranker, Stage.GENERATE: self.generator,
                Stage.SENTIMENT: self.sentiment, Stage.TOXICITY: self.toxicity}

    def devices(self) -> dict[str, str]:
        return {str(stage): f"{model.placement.device}/{model.placement.precision}"
                for stage, model in self.models().items()}

    def numerics(self) -> dict[str, object]:
        """What decides a reply's bits here besides the request, the models' weights and the documents: torch's
        version, each stage's device and precision, oneDNN's instruction-set level (its AVX2 and AVX-512 kernels
        sum a product differently) and whether the CPU's decode attention is pipeline.kernels.ordered_attention
        (built) or torch's flash kernel in chunks (other roundings). The int8 kernels are left out: they give
        the same bits wherever they run. Two workers whose numerics are equal give a request the same reply."""
        import torch

        from pipeline.cpu_features import onednn_checked_level
        from pipeline.kernels.ordered_attention import EXTENSION as ORDERED
        return {"torch": torch.__version__, "stages": self.devices(),
                "onednn_isa": onednn_checked_level() or "unchecked",
                "cpu_decode_attention": "ordered" if ORDERED.ops() is not None else "flash-chunks"}
