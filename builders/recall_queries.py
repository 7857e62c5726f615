"""The recall check's queries kept in a version: what lets a built version be re-tuned without a rebuild.

Every build (builders.data, builders.incremental, builders.ingest) writes ``recall_queries.npz`` beside
its index files: the queries its recall@10 was measured on (builders.recall.sample_queries: documents'
own vectors perturbed, plus any real queries), which documents they perturbed, and each shard's exact
top 10 (an exhaustive L2 search of the vectors the build wrote). 1,000 queries of 768 dimensions take
3 MB; the manifest names the file with its sha256 (``recall_queries``), so ``python -m builders.manifest
verify`` and deploy/copy-data.sh check it as they check the index files.

``python -m builders.recall tune DIR`` (builders.recall.tune_version) searches the version's own files
with them and needs no vector, so every kind a build writes can be tuned: IVF-Flat, IVF-SQ8, IVF-PQ and
OPQ-IVF-PQ with their exact re-ranking, HNSW, in hash or centroid shards.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builders.build_files import INDEX_FILENAME, BuildError, fsync_path, index_files
from builders.manifest import file_sha256
from pipeline.data_version import Manifest

Hits = tuple[np.ndarray, np.ndarray]  # (ids (q, k), distances (q, k))


@dataclass(frozen=True)
class Queries:
    vectors: np.ndarray
    rows: np.ndarray  # the documents perturbed, in order (extra queries follow them)
    noise: float
    seed: int
    extra: int = 0


def save_queries(path: Path, queries: Queries, exact: Sequence[Hits]) -> None:
    """``queries`` and their exact answers (one per shard) written to ``path``, fsynced."""
    with open(path, "wb") as out:  # a file object: np.savez would add ".npz" to a name without it
        np.savez(out, vectors=queries.vectors, rows=queries.rows, noise=np.float64(queries.noise),
                 seed=np.int64(queries.seed), extra=np.int64(queries.extra),
                 exact_ids=np.stack([ids for ids, _ in exact]), exact_distances=np.stack([d for _, d in exact]))
    fsync_path(path)


def load_queries(path: Path) -> tuple[Queries, list[Hits]]:
    """What :func:`save_queries` wrote; BuildError naming the file if it is not such a file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            queries = Queries(np.ascontiguousarray(data["vectors"], dtype=np.float32), data["rows"],
                              float(data["noise"]), int(data["seed"]), int(data["extra"]))
            ids, distances = data["exact_ids"], data["exact_distances"]
    except (OSError, KeyError, ValueError) as exc:
        raise BuildError(f"{path} is not a build's recall queries: {exc}") from None
    if ids.ndim != 3 or ids.shape != distances.shape or ids.shape[1] != len(queries.vectors):
        raise BuildError(f"{path} holds {len(queries.vectors)} queries but exact answers of shape {ids.shape}")
    return queries, [(ids[shard], distances[shard]) for shard in range(len(ids))]


def kept_queries(version_dir: Path, manifest: Manifest) -> tuple[Queries, list[Hits]] | None:
    """The queries the version's build kept, checked against the manifest's sha256; None if it names none."""
    record = manifest.recall_queries
    if not record:
        return None
    path = version_dir / record["file"]
    if not path.is_file():
        raise BuildError(f"{path} is missing: the manifest names it as the recall queries its build kept")
    if file_sha256(path) != record["sha256"]:
        raise BuildError(f"{path} is not the file the build wrote (sha256 differs from the manifest's): "
                         "restore it from the version's source (python -m builders.manifest verify says so too)")
    return load_queries(path)


def shard_files(version_dir: Path, manifest: Manifest) -> list[Path]:
    """The version's index files, one per shard (a centroid layout's quantizer, also named, is not one)."""
    return index_files(version_dir / INDEX_FILENAME, manifest.shards)
