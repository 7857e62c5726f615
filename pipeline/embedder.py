"""Stage 1: the query embedding, by the sentence-transformers model EMBEDDER_MODEL (the contract's
bge-base-en-v1.5 by default; a hub repo id or a local folder). Its dimension is the model's own, read
from its files before it loads (:func:`embedding_dimension`, for the data-version check) and from the
loaded model after."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.data_version import EmbedderInfo, embedder_info
from pipeline.device import Placement, placement_for
from pipeline.models import ModelSource, resolve_model_source
from pipeline.precision import apply_precision

# Similarities an L2 index ranks rightly: cosine on unit vectors, euclidean on the raw ones.
L2_RANKED = ("cosine", "euclidean")


def is_folder(name: str) -> bool:
    """A model named by a folder rather than a hub repo id (sentence-transformers' own rule: a path that
    exists is a path)."""
    return Path(name).expanduser().is_dir()


def model_files(name: str, source: ModelSource):
    """A reader of the model's files (a relative name -> its text, None if absent): from its folder, or
    from the hub cache `source` reads (downloading only when the source may)."""
    if is_folder(name):
        root = Path(name).expanduser()
        return lambda relative: (root / relative).read_text() if (root / relative).is_file() else None

    def from_hub(relative: str) -> str | None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
        try:
            return Path(hf_hub_download(name, relative, **source.hf_kwargs())).read_text()
        except (EntryNotFoundError, LocalEntryNotFoundError):
            return None
    return from_hub


def _pooling_width(config: dict) -> int:
    """A Pooling module's output: its input width once per mode (both config formats: sentence-transformers
    up to 5 wrote one boolean per mode, 6 writes `pooling_mode`)."""
    width = int(config.get("embedding_dimension") or config["word_embedding_dimension"])
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return width * (1 if isinstance(mode, str) else len(mode))
    return width * max(1, sum(1 for key, on in config.items() if key.startswith("pooling_mode_") and on is True))


def embedding_dimension(name: str, source: ModelSource) -> int | None:
    """The width of the vectors `name` gives, from its sentence-transformers files (modules.json, each
    module's config) without loading it; None where a module's width is not written in a way read here."""
    read = model_files(name, source)
    modules = json.loads(read("modules.json") or "[]") or [{"type": "Transformer", "path": ""}]
    dim = None
    for module in modules:
        kind, folder = module["type"].rsplit(".", 1)[-1], module.get("path", "")
        config = json.loads(read(f"{folder}/config.json".lstrip("/")) or "{}")
        if kind == "Transformer":
            dim = config.get("hidden_size")
        elif kind == "Pooling":
            dim = _pooling_width(config)
        elif kind == "Dense":
            dim = config.get("out_features")
        elif kind != "Normalize":
            return None
    return int(dim) if dim else None


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


def check_model_source(name: str, source: ModelSource) -> None:
    """A stand-in home holds stand-ins of the contract's embedder only: another one by repo id is refused."""
    if source.is_standin and name != spec.EMBEDDER_MODEL and not is_folder(name):
        raise ConfigError(f"EMBEDDER_MODEL={name}: MODEL_SOURCE=standin has a stand-in of {spec.EMBEDDER_MODEL} only; "
                          "name a local sentence-transformers folder, or use MODEL_SOURCE=hub")


def identity(settings: Settings, source: ModelSource, precision: str | None = None) -> EmbedderInfo:
    """Which embedder `settings` configure, for a manifest or the check against one, before any model
    loads (the dimension from its files; loaded once on the CPU only where they do not say it)."""
    name = settings.embed.model
    check_model_source(name, source)
    dim = embedding_dimension(name, source) or Embedder.load(source, Placement("cpu", "float32"), name).dim
    return embedder_info(source, precision or placement_for(settings, Embedder.stage).precision, dim, name)


class Embedder:
    stage = spec.Stage.EMBED

    def __init__(self, model, placement: Placement, normalize: bool = True, name: str = spec.EMBEDDER_MODEL,
                 dim: int | None = None):
        """`dim`: the vectors' width; None reads it from the model."""
        self.model = model
        self.placement = placement
        self.normalize = normalize
        self.name = name
        if dim is None:
            # get_embedding_dimension since sentence-transformers 6 (the older name warns there)
            dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = int(dimension())
        self.dim = dim

    @classmethod
    def load(cls, source: ModelSource, placement: Placement, name: str = spec.EMBEDDER_MODEL,
             **int8_options) -> "Embedder":
        """`name`: the model (a hub repo id or a folder); `int8_options`: see apply_precision. Its vectors are
        unit rows where the model normalises or scores by cosine (sentence-transformers' default)."""
        from sentence_transformers import SentenceTransformer
        check_model_source(name, source)
        model = SentenceTransformer(str(Path(name).expanduser()) if is_folder(name) else name, device=placement.device,
                                    cache_folder=source.hf_kwargs().get("cache_dir"), revision=source.revision(name),
                                    local_files_only=source.local_files_only, model_kwargs={"dtype": placement.torch_dtype})
        normalises = any(type(module).__name__ == "Normalize" for module in model)
        if not normalises and model.similarity_fn_name not in L2_RANKED:
            raise ConfigError(f"EMBEDDER_MODEL={name} scores by {model.similarity_fn_name} without normalising: an L2 "
                              f"index does not rank by it; choose a model scored by {' or '.join(L2_RANKED)}")
        normalize = normalises or model.similarity_fn_name == "cosine"
        return cls(apply_precision(without_normalize(model).eval(), placement.precision, **int8_options), placement,
                   normalize, name)

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None) -> "Embedder":
        source = source or resolve_model_source(settings)
        return cls.load(source, placement_for(settings, cls.stage), name=settings.embed.model)

    def embed(self, texts: list[str]) -> np.ndarray:
        """(n, dim) float32 (unit norm where the model's similarity asks for it); no query prefix, as the
        reference did."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = np.ascontiguousarray(self.model.encode(list(texts), batch_size=len(texts), normalize_embeddings=False,
                                                         convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)
        return unit_rows(vectors) if self.normalize else vectors

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.embed(texts))
