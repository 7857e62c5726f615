"""The embedder a build embeds with, its tokenizer and limit, and passages embedded in batches of
similar length (sorted by token count: little padding), with a progress bar."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from builders.embedding import checked_embeddings
from builders.ingest.splitter import TokenCounter
from pipeline import spec
from pipeline.data_version import EmbedderInfo

EmbedFn = Callable[[list[str]], np.ndarray]
DEFAULT_BATCH = 32


@dataclass(frozen=True)
class IngestEmbedder:
    embed: EmbedFn
    identity: EmbedderInfo  # for the manifest
    counter: TokenCounter
    limit: int  # the longest text it embeds whole, in its tokens with special ones


def from_embedder(embedder, identity: EmbedderInfo) -> IngestEmbedder:
    """A pipeline.embedder.Embedder: its sentence-transformers model's tokenizer and max_seq_length
    (bounded by the contract's truncation length)."""
    model = embedder.model
    limit = min(int(model.max_seq_length or spec.TRUNCATE_LENGTH), spec.TRUNCATE_LENGTH)
    return IngestEmbedder(embedder.embed, identity, TokenCounter(model.tokenizer), limit)


def configured() -> IngestEmbedder:
    """The embedder the environment configures (the one the nodes search with)."""
    from builders.standins import source_building_standins
    from pipeline.config import Settings
    from pipeline.data_version import embedder_info
    from pipeline.embedder import Embedder
    settings = Settings.from_env()
    source = source_building_standins(settings)
    embedder = Embedder.from_settings(settings, source)
    return from_embedder(embedder, embedder_info(source, embedder.placement.precision, embedder.dim, embedder.name))


def embed_sorted(texts: Sequence[str], tokens: Sequence[int], embed: EmbedFn, dim: int, batch_size: int,
                 progress: bool) -> np.ndarray:
    """(len(texts), dim) float32 in the order of `texts`, embedded in batches of texts of similar length."""
    vectors = np.empty((len(texts), dim), dtype=np.float32)
    order = np.argsort(np.asarray(tokens, dtype=np.int64), kind="stable")
    with tqdm(total=len(texts), desc="embedding passages", unit="passage", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = checked_embeddings(embed([texts[row] for row in rows]), len(rows))
            if batch.shape[1] != dim:
                raise ValueError(f"the embedder gave {batch.shape[1]}-dimensional vectors, expected {dim}")
            vectors[rows] = batch
            bar.update(len(rows))
    return vectors
