"""Centroid shards: each shard owns a set of the IVF lists of one trained index, and a query goes only
to the shards owning its ``nprobe`` nearest lists, with those list ids (the seed's "store the IVF
centroids centrally and route a query to the k nearest centroids' shards").

The layout. :func:`assign_lists` gives every list an owner: ``kmeans`` (the default) clusters the
centroids in N groups (weighted by list sizes), then gives each list, nearest pairs first, to the
nearest group with room (at most 2% over 1/N of the vectors); ``bisect`` splits the centroids
recursively along their widest principal direction at the size-weighted median; ``greedy`` deals the
lists, largest first, to the least-loaded shard (balanced, with no regard to where the lists lie).
The first two keep neighbouring lists on one shard, so a query's nearest lists fall in few shards. The searching
node holds the coarse quantizer (``<index stem>.quantizer.bin`` in the data version) and the owners
(the manifest's ``sharding``); :class:`CentroidRouter` turns a batch of queries into one request per
shard it needs.

Exactness. The router assigns a query to the same ``nprobe`` lists as the unsharded index does
(the same quantizer); each shard scans its share of them in the same order with the same code, so
every distance is the unsharded one, and :func:`merge_routed` keeps the k smallest, equal distances
ordered by id as faiss orders them. Equal distances at the k-th place from vectors in one list
(duplicates) come back as faiss returns them (the smallest ids: a list holds its ids in increasing
order); equal distances at the k-th place from vectors in two different lists may come back as
another of the tied ids than faiss's (faiss keeps the one it scanned first).

Pure: no threads, no HTTP.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pipeline.shards import PADDING_DISTANCE, PADDING_ID

CENTROID = "centroid"  # the manifest's sharding kind
METHODS = ("kmeans", "bisect", "greedy")
KMEANS_SLACK = 1.02  # a kmeans shard holds at most 2% over its share of the vectors (plus one list)


def quantizer_path(index_path: str | Path) -> Path:
    """The coarse quantizer's file beside the index: ``faiss_index.bin`` -> ``faiss_index.quantizer.bin``."""
    path = Path(index_path)
    return path.with_name(f"{path.stem}.quantizer{path.suffix}")


def assign_lists(centroids: np.ndarray, sizes: np.ndarray, shards: int, method: str = "kmeans") -> np.ndarray:
    """The owning shard of each of the ``len(centroids)`` lists (int64), balanced by ``sizes``."""
    nlist = len(centroids)
    if not 1 <= shards <= nlist:
        raise ValueError(f"centroid shards need 1 to nlist ({nlist}) shards, got {shards}")
    if len(sizes) != nlist:
        raise ValueError(f"{len(sizes)} list sizes for {nlist} lists")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    owners = np.empty(nlist, dtype=np.int64)
    # Weight 1 on empty lists too, so that every shard is given lists even from an empty index.
    weights = np.asarray(sizes, dtype=np.float64) + 1.0
    if method == "greedy":
        loads = np.zeros(shards)
        for lst in np.argsort(-weights, kind="stable"):
            owner = int(np.argmin(loads))
            owners[lst] = owner
            loads[owner] += weights[lst]
        return owners
    if method == "kmeans":
        return _balanced_kmeans(np.ascontiguousarray(centroids, dtype=np.float32), weights, shards)
    _bisect(np.asarray(centroids, dtype=np.float64), weights, np.arange(nlist), 0, shards, owners)
    return owners


def _balanced_kmeans(centroids: np.ndarray, weights: np.ndarray, shards: int, seed: int = 1234) -> np.ndarray:
    """Weighted k-means of the centroids into `shards` groups, then each list to its nearest group with
    room, the closest (list, group) pairs first: the groups' regions, balanced."""
    nlist, dim = centroids.shape
    kmeans = faiss.Kmeans(dim, shards, niter=20, seed=seed, max_points_per_centroid=max(256, nlist))
    kmeans.train(centroids, weights=weights.astype(np.float32))
    means = np.asarray(kmeans.centroids)
    # (nlist, shards) squared distances, without the (nlist, shards, dim) difference array.
    distances = ((centroids ** 2).sum(axis=1)[:, None] - 2 * centroids @ means.T + (means ** 2).sum(axis=1)[None, :])
    capacity = weights.sum() / shards * KMEANS_SLACK + weights.max()
    owners = np.full(nlist, -1, dtype=np.int64)
    loads, placed = np.zeros(shards), 0
    for pair in np.argsort(distances, axis=None, kind="stable"):
        lst, shard = divmod(int(pair), shards)
        if owners[lst] < 0 and loads[shard] + weights[lst] <= capacity:
            owners[lst] = shard
            loads[shard] += weights[lst]
            placed += 1
            if placed == nlist:  # the capacity leaves room for every list: each finds a shard
                break
    # A shard left with no list (a group k-means left empty) takes the nearest list of the fullest shard.
    for empty in np.flatnonzero(np.bincount(owners, minlength=shards) == 0).tolist():
        fullest = np.flatnonzero(owners == int(np.argmax(np.bincount(owners, weights=weights, minlength=shards))))
        owners[fullest[np.argmin(distances[fullest, empty])]] = empty
    return owners


def _bisect(centroids: np.ndarray, weights: np.ndarray, lists: np.ndarray, first: int, count: int,
            owners: np.ndarray) -> None:
    """Shards first..first+count-1 for `lists`: halves along the widest direction, each half's weight
    in proportion to its number of shards, each side keeping at least one list per shard."""
    if count == 1:
        owners[lists] = first
        return
    points = centroids[lists]
    centred = points - points.mean(axis=0)
    # The leading right singular vector: the direction the centroids spread most along.
    direction = np.linalg.svd(centred, full_matrices=False)[2][0] if len(lists) > 1 else np.zeros(points.shape[1])
    order = lists[np.lexsort((lists, centred @ direction))]
    left_count = count // 2
    cumulative = np.cumsum(weights[order])
    cut = int(np.searchsorted(cumulative, cumulative[-1] * left_count / count)) + 1
    cut = min(max(cut, left_count), len(order) - (count - left_count))
    _bisect(centroids, weights, order[:cut], first, left_count, owners)
    _bisect(centroids, weights, order[cut:], first + left_count, count - left_count, owners)


@dataclass(frozen=True)
class Route:
    """What one shard is asked: the batch rows it answers and each row's lists to probe (in probe order)."""
    shard: int
    rows: np.ndarray
    lists: list[list[int]]


class CentroidRouter:
    """The coarse quantizer and the list owners: which shards a batch of queries visits, with which lists."""

    def __init__(self, quantizer: faiss.Index, owners: np.ndarray, shards: int, nprobe: int):
        owners = np.asarray(owners, dtype=np.int64)
        if quantizer.ntotal != len(owners):
            raise ValueError(f"the quantizer has {quantizer.ntotal} centroids but {len(owners)} lists have owners")
        if len(owners) and (owners.min() < 0 or owners.max() >= shards):
            raise ValueError(f"list owners must be shards 0 to {shards - 1}")
        if nprobe < 1:
            raise ValueError(f"nprobe must be >= 1, got {nprobe}")
        self.quantizer, self.owners, self.shards = quantizer, owners, shards
        self.nprobe = min(int(nprobe), len(owners))

    @property
    def nlist(self) -> int:
        return len(self.owners)

    @property
    def dim(self) -> int:
        return int(self.quantizer.d)

    @classmethod
    def load(cls, version_dir: str | Path, index_name: str, sharding: dict[str, Any], nprobe: int) -> CentroidRouter:
        """The router of a centroid-sharded version: its quantizer file and the manifest's owners."""
        path = Path(version_dir) / str(sharding.get("quantizer") or quantizer_path(index_name).name)
        quantizer = faiss.read_index(os.fspath(path))
        return cls(quantizer, np.asarray(sharding["owners"], dtype=np.int64), int(sharding["shards"]), nprobe)

    def probe_lists(self, vectors: np.ndarray) -> np.ndarray:
        """Each query's ``nprobe`` nearest lists, nearest first ((n, nprobe) int64), as IndexIVF.search assigns."""
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        _, lists = self.quantizer.search(x, self.nprobe)
        return lists

    def route(self, vectors: np.ndarray) -> list[Route]:
        """One Route per shard that at least one query needs, in shard order."""
        lists = self.probe_lists(vectors)
        owners = np.where(lists >= 0, self.owners[np.maximum(lists, 0)], -1)
        routes = []
        for shard in range(self.shards):
            rows = np.flatnonzero((owners == shard).any(axis=1))
            if len(rows):
                routes.append(Route(shard, rows, [lists[row][owners[row] == shard].tolist() for row in rows]))
        return routes


def merge_routed(queries: int, answers: Sequence[tuple[np.ndarray, Sequence[Sequence[int]], Sequence[Sequence[float]]]],
                 k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each query's top ``k`` over the shards that answered it: ``answers`` holds, per shard asked,
    (its rows of the batch, each row's ids, each row's distances); -1 padding dropped; equal distances
    ordered by id (faiss's order). A query no shard answered gets no hits."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    candidates: list[list[tuple[float, int]]] = [[] for _ in range(queries)]
    for rows, ids, distances in answers:
        if len(rows) != len(ids) or len(ids) != len(distances):
            raise ValueError(f"an answer for {len(rows)} rows holds {len(ids)} id rows and {len(distances)} distance rows")
        for row, row_ids, row_distances in zip(rows, ids, distances):
            candidates[int(row)] += [(float(d), int(i)) for i, d in zip(row_ids, row_distances) if int(i) != PADDING_ID]
    merged_ids, merged_distances = [], []
    for found in candidates:
        best = sorted(set(found))[:k]  # a shard's lists are disjoint from another's: no id twice
        merged_ids.append([i for _, i in best])
        merged_distances.append([d for d, _ in best])
    return merged_ids, merged_distances


def padded(ids: list[list[int]], distances: list[list[float]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_routed`'s lists in faiss's array shapes, padded as faiss pads an L2 search."""
    ids_out = np.full((len(ids), k), PADDING_ID, dtype=np.int64)
    distances_out = np.full((len(ids), k), PADDING_DISTANCE, dtype=np.float32)
    for row, (row_ids, row_distances) in enumerate(zip(ids, distances)):
        ids_out[row, : len(row_ids)] = row_ids
        distances_out[row, : len(row_distances)] = row_distances
    return ids_out, distances_out


def sharding_record(owners: np.ndarray, shards: int, method: str, quantizer_file: str) -> dict[str, Any]:
    """The manifest's ``sharding`` for a centroid layout."""
    return {"kind": CENTROID, "shards": shards, "method": method, "quantizer": quantizer_file,
            "owners": [int(owner) for owner in owners]}


def is_centroid(sharding: dict[str, Any] | None) -> bool:
    return bool(sharding) and (sharding or {}).get("kind") == CENTROID
