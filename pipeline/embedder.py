"""Stage 1: the query embedding (bge-base through sentence-transformers)."""
from __future__ import annotations

import numpy as np

from pipeline import spec
from pipeline.config import Settings
from pipeline.device import Placement, placement_for
from pipeline.models import ModelSource, resolve_model_source
from pipeline.precision import apply_precision


def without_normalize(model):
    """The sentence-transformers `model` without its Normalize module: :func:`unit_rows` normalises
    instead (the model's pooling, bge's CLS token, sums nothing along a row)."""
    for index in reversed(range(len(model))):
        if type(model[index]).__name__ == "Normalize":
            del model[index]
    return model


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """(n, d) float32 rows scaled to unit length, in float32 on the CPU, each row's length summed by
    numpy alone in one order whatever the rows beside it. Not torch's normalisation on the model's
    device: CUDA sums a row there in an order chosen by the number of rows, and in a bfloat16 model
    it leaves norms ~0.3% off 1."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


class Embedder:
    stage = spec.Stage.EMBED

    def __init__(self, model, placement: Placement):
        self.model = model
        self.placement = placement

    @classmethod
    def load(cls, source: ModelSource, placement: Placement, name: str = spec.EMBEDDER_MODEL,
             **int8_options) -> "Embedder":
        """`name`: the model (a hub name or a folder; profiling/real_fidelity.py loads another
        sentence-transformers encoder the same way); `int8_options`: see apply_precision."""
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(name, device=placement.device, cache_folder=source.hf_kwargs().get("cache_dir"),
                                    revision=source.revision(name), local_files_only=source.local_files_only,
                                    model_kwargs={"dtype": placement.torch_dtype})
        return cls(apply_precision(without_normalize(model).eval(), placement.precision, **int8_options), placement)

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None) -> "Embedder":
        source = source or resolve_model_source(settings)
        return cls.load(source, placement_for(settings, cls.stage))

    def embed(self, texts: list[str]) -> np.ndarray:
        """(n, 768) float32, unit norm; no query prefix, as the reference did."""
        if not texts:
            return np.zeros((0, spec.EMBED_DIM), dtype=np.float32)
        vectors = self.model.encode(list(texts), batch_size=len(texts), normalize_embeddings=False,
                                    convert_to_numpy=True, show_progress_bar=False)
        return unit_rows(np.ascontiguousarray(vectors, dtype=np.float32))

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.embed(texts))
