"""The support corpus's documents inserted and embedded in the same batches (one pass over the corpus)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from builders.build_files import chunks, db_writer

EmbedFn = Callable[[list[str]], np.ndarray]


def write_and_embed(db_path: Path, docs, n_docs: int, embed_fn: EmbedFn, batch_size: int, progress: bool) -> np.ndarray:
    """Insert the documents and return their embeddings as an (n_docs, d) float32 array."""
    vectors: np.ndarray | None = None
    done = 0
    with db_writer(db_path) as insert:
        for chunk in chunks(docs, batch_size, n_docs, "documents+embeddings", progress):
            insert([doc.as_row() for doc in chunk])
            emb = checked_embeddings(embed_fn([doc.content for doc in chunk]), len(chunk))
            if vectors is None:
                vectors = np.empty((n_docs, emb.shape[1]), dtype=np.float32)
            elif emb.shape[1] != vectors.shape[1]:
                raise ValueError(f"embedding dimension changed from {vectors.shape[1]} to {emb.shape[1]}")
            vectors[done : done + len(chunk)] = emb
            done += len(chunk)
    if done != n_docs:
        raise RuntimeError(f"corpus produced {done} documents, expected {n_docs}")
    return vectors


def checked_embeddings(emb, rows: int) -> np.ndarray:
    emb = np.asarray(emb, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != rows:
        raise ValueError(f"embed_fn returned shape {emb.shape} for {rows} texts")
    if not np.isfinite(emb).all():
        raise ValueError("embed_fn returned NaN or infinite values")
    return emb
