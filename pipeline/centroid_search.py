"""A centroid shard's search of given lists (faiss ``search_preassigned``), the lists it owns, and a
centroid-sharded index searched in one process (what the tests and profiling.shard_fanout compare
with the unsharded index).

Pure: no threads, no HTTP.
"""
from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np

from pipeline.centroid_routing import CentroidRouter, merge_routed, padded
from pipeline.shards import PADDING_ID


def owned_lists(owners: Sequence[int], shard: int) -> frozenset[int]:
    """The lists a shard owns, by the manifest's owners."""
    return frozenset(int(lst) for lst in np.flatnonzero(np.asarray(owners) == shard))


class ProbedSearch:
    """Searches one IVF index over the lists each query names, as IndexIVF.search does over the
    lists its quantizer picks (same scan, same heap): lists padded with -1, which faiss skips."""

    def __init__(self, index: faiss.Index):
        self.index = index  # the owner: the IVF view below does not keep it alive
        self.ivf = faiss.extract_index_ivf(index)
        # The coarse distances faiss hands each list's scanner (IVF-Flat ignores them; others use them).
        self.centroids = self.ivf.quantizer.reconstruct_n(0, self.ivf.nlist)

    @property
    def nlist(self) -> int:
        return int(self.ivf.nlist)

    def search(self, vectors: np.ndarray, lists: Sequence[Sequence[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n, k) int64, distances (n, k) float32) over each row's lists, -1 padded."""
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(x)
        width = max((len(row) for row in lists), default=0)
        if n == 0 or width == 0:
            return np.full((n, k), PADDING_ID, dtype=np.int64), np.full((n, k), np.inf, dtype=np.float32)
        keys = np.full((n, width), -1, dtype=np.int64)
        for row, row_lists in enumerate(lists):
            keys[row, : len(row_lists)] = row_lists
        used = np.maximum(keys, 0)
        coarse = ((x[:, None, :] - self.centroids[used]) ** 2).sum(axis=2, dtype=np.float32)
        coarse = np.ascontiguousarray(np.where(keys >= 0, coarse, np.inf), dtype=np.float32)
        distances = np.empty((n, k), dtype=np.float32)
        ids = np.empty((n, k), dtype=np.int64)
        params = faiss.SearchParametersIVF()
        params.nprobe = width
        # The C++ call (the Python wrapper insists on the index's own nprobe as the width); the arrays are
        # held in names above, since swig_ptr keeps no reference to them.
        self.ivf.search_preassigned_c(  # type: ignore[attr-defined]
            n, faiss.swig_ptr(x), k, faiss.swig_ptr(keys), faiss.swig_ptr(coarse), faiss.swig_ptr(distances),
            faiss.swig_ptr(ids), False, params)
        return ids, distances


class CentroidShardedIndex:
    """Centroid shards searched in one process: the router's lists, each shard's probed search, the merge."""

    def __init__(self, router: CentroidRouter, shards: Sequence[faiss.Index]):
        if len(shards) != router.shards:
            raise ValueError(f"{len(shards)} shard indexes for a {router.shards}-shard layout")
        self.router = router
        self.shards = [ProbedSearch(shard) for shard in shards]

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        answers = []
        for route in self.router.route(vectors):
            ids, distances = self.shards[route.shard].search(vectors[route.rows], route.lists, k)
            answers.append((route.rows, ids.tolist(), distances.tolist()))
        return padded(*merge_routed(len(vectors), answers, k), k)
