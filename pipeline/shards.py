"""A sharded index: which shard holds a document (``i % N``), where each shard's file lies (beside
``FAISS_INDEX_PATH``: ``faiss_index.bin`` -> ``faiss_index.shard-0-of-2.bin``), and merging every
shard's top k by ascending L2 distance.

Exactness. For an exact index (``IndexFlatL2``) every shard returns its true top k, so the merged top k
is the unsharded top k, ids and distances. For IVF it depends on the coarse quantizer: shards that share
the unsharded index's trained quantizer (what ``builders.data build --shards N`` writes) probe the same
``nprobe`` lists, whose union is what the unsharded index probes, so the merge equals the unsharded IVF
search too; shards trained each on its own vectors probe their own lists, so their merged results can
differ a little from the unsharded IVF index's.

Ties. Equal distances are ordered by shard position, then by rank within the shard, so a merge is
deterministic; faiss may order exact ties among its own results differently.

Pure: no threads, no HTTP, no faiss.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# What faiss puts in place of an id, and of its L2 distance, when it finds fewer than k results.
PADDING_ID = -1
PADDING_DISTANCE = float(np.finfo(np.float32).max)

Hits = tuple[Sequence[int], Sequence[float]]  # one query's (ids, distances), ascending distance


def shard_path(index_path: str | Path, shard: int, shards: int) -> Path:
    """The file of shard ``shard`` of ``shards``: ``<dir>/<stem>.shard-<k>-of-<N><suffix>``; one shard is
    the unsharded index itself (``shard_path(p, 0, 1) == p``)."""
    _check_count(shards)
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be between 0 and {shards - 1}, got {shard}")
    path = Path(index_path)
    if shards == 1:
        return path
    return path.with_name(f"{path.stem}.shard-{shard}-of-{shards}{path.suffix}")


def document_shard(doc_id, shards: int):
    """The shard holding ``doc_id`` (an int or an integer array): ``doc_id % shards``."""
    _check_count(shards)
    return doc_id % shards


def merge_top_k(per_shard: Sequence[Hits], k: int) -> tuple[list[int], list[float]]:
    """One query's top ``k`` over every shard's ``(ids, distances)`` (faiss order; -1 padding dropped).

    An id that two shards both return (they should be disjoint) is kept once, at its best place.
    The result is shorter than ``k`` when the shards hold fewer than ``k`` vectors together."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    candidates = []
    for position, (ids, distances) in enumerate(per_shard):
        if len(ids) != len(distances):
            raise ValueError(f"shard {position}: {len(ids)} ids but {len(distances)} distances")
        for rank, (doc_id, distance) in enumerate(zip(ids, distances)):
            if int(doc_id) != PADDING_ID:
                candidates.append((float(distance), position, rank, int(doc_id)))
    best: dict[int, float] = {}  # id -> its smallest distance, in merged order
    for distance, _, _, doc_id in sorted(candidates):
        best.setdefault(doc_id, distance)
        if len(best) == k:
            break
    return list(best), list(best.values())


def merge_batch(per_shard: Sequence[Sequence[Hits]], k: int) -> list[tuple[list[int], list[float]]]:
    """:func:`merge_top_k` for a batch: ``per_shard[s][q]`` is shard ``s``'s answer to query ``q``."""
    if not per_shard:
        raise ValueError("no shards to merge")
    queries = len(per_shard[0])
    if any(len(answers) != queries for answers in per_shard):
        raise ValueError(f"shards answered different numbers of queries: {[len(a) for a in per_shard]}")
    return [merge_top_k([answers[q] for answers in per_shard], k) for q in range(queries)]


def merge_arrays(per_shard: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_batch` in faiss's array shapes: each shard's ``(ids (n, k'), distances (n, k'))``
    in, ``(ids int64 (n, k), distances float32 (n, k))`` out, padded as faiss pads an L2 search
    (id -1, distance the largest float32) where fewer than ``k`` were found."""
    merged = merge_batch([list(zip(ids.tolist(), distances.tolist())) for ids, distances in per_shard], k)
    ids_out = np.full((len(merged), k), PADDING_ID, dtype=np.int64)
    distances_out = np.full((len(merged), k), PADDING_DISTANCE, dtype=np.float32)
    for row, (ids, distances) in enumerate(merged):
        ids_out[row, : len(ids)] = ids
        distances_out[row, : len(distances)] = distances
    return ids_out, distances_out


def shard_file_problems(index_path: str | Path, shards: int) -> list[str]:
    """What is wrong with the index files for ``shards`` shards, one line each: every shard file
    missing, and every shard file of another shard count beside them (left by an earlier build:
    serving with the wrong count would silently lose or repeat documents)."""
    _check_count(shards)
    path = Path(index_path)
    missing = [k for k in range(shards) if not shard_path(path, k, shards).is_file()]
    if shards == 1:
        problems = [f"the index file is missing: {path}" for _ in missing]
    else:
        problems = [f"shard {k} of {shards} is missing: {shard_path(path, k, shards)}" for k in missing]
        if missing and path.is_file():
            problems.append(f"{path} beside them is an unsharded index: serve it with INDEX_SHARDS=1, or build "
                            f"{shards} shards with `python -m builders.data build ... --shards {shards}`")
    for shard, count, other in sorted(f for f in shard_files_beside(path) if f[1] != shards):
        problems.append(f"{other} is shard {shard} of a {count}-shard build, but INDEX_SHARDS={shards}")
    return problems


def shard_files_beside(index_path: str | Path) -> list[tuple[int, int, Path]]:
    """(shard, count, path) of every shard file, of any count, beside ``index_path``."""
    index_path = Path(index_path)
    pattern = re.compile(rf"{re.escape(index_path.stem)}\.shard-(\d+)-of-(\d+){re.escape(index_path.suffix)}")
    folder = index_path.parent
    matches = [(pattern.fullmatch(f.name), f) for f in folder.iterdir()] if folder.is_dir() else []
    return [(int(match[1]), int(match[2]), f) for match, f in matches if match]


def _check_count(shards: int) -> None:
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"the shard count must be a positive integer, got {shards!r}")
