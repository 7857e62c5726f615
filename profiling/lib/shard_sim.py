"""Shard fan-out and load, counted: what each index node gets per query under hash shards (doc_id % N)
and centroid shards (pipeline.centroid_routing), and a scaled-down run with one process per shard.

Counts, not timings: shards asked per query, queries and IVF lists each shard is asked for, and the
vectors it scans (the sizes of its part of those lists); and, computed from them, each node's vectors and
bytes at the full size.
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pipeline.centroid_routing import CentroidRouter, merge_routed, padded

# The plan's full-size indexes (docs/scaling.md): vectors and nlist (about 6.5 x sqrt(vectors), a power of 2).
SCENARIOS = {"100M": (100_000_000, 65_536), "1B": (1_000_000_000, 262_144)}
POINTS_PER_LIST = 39


def shard_shares(index: faiss.IndexIVF, shards: int, owners: np.ndarray | None) -> np.ndarray:
    """(nlist, shards) vectors of each list on each shard: by doc_id % N (owners None), else the owner's."""
    shares = np.zeros((index.nlist, shards), dtype=np.int64)
    for lst in range(index.nlist):
        size = index.invlists.list_size(lst)
        if not size:
            continue
        if owners is not None:
            shares[lst, owners[lst]] = size
        else:
            ids = faiss.rev_swig_ptr(index.invlists.get_ids(lst), size)
            shares[lst] = np.bincount(ids % shards, minlength=shards)
    return shares


@dataclass(frozen=True)
class Load:
    """One layout's counts over a set of queries."""
    layout: str
    shards: int
    queries: int
    visited: np.ndarray        # (queries,) shards asked per query
    shard_queries: np.ndarray  # (shards,) queries each shard is asked
    shard_lists: np.ndarray    # (shards,) lists each shard scans, summed over the queries
    shard_vectors: np.ndarray  # (shards,) vectors each shard scans, summed over the queries

    def row(self) -> dict[str, Any]:
        q = self.queries
        return {"layout": self.layout, "shards": self.shards, "shards_per_query_mean": float(self.visited.mean()),
                "shards_per_query_p50": float(np.percentile(self.visited, 50)),
                "shards_per_query_max": int(self.visited.max()),
                "queries_per_shard_min": float(self.shard_queries.min() / q),
                "queries_per_shard_max": float(self.shard_queries.max() / q),
                "lists_per_query_all_shards": float(self.shard_lists.sum() / q),
                "vectors_per_query_all_shards": float(self.shard_vectors.sum() / q),
                "vectors_per_query_busiest_shard": float(self.shard_vectors.max() / q)}


def count_load(layout: str, probed: np.ndarray, shares: np.ndarray, owners: np.ndarray | None) -> Load:
    """Counts for `probed` ((queries, nprobe) lists): hash shards are all asked and each scans its part of
    every probed list; a centroid shard is asked when it owns a probed list, and scans those it owns."""
    queries, shards = len(probed), shares.shape[1]
    valid = probed >= 0
    lists = np.where(valid, probed, 0)
    if owners is None:
        asked = np.ones((queries, shards), dtype=bool)
        lists_per = np.repeat(valid.sum(axis=1, keepdims=True), shards, axis=1)
    else:
        lists_per = np.stack([((owners[lists] == shard) & valid).sum(axis=1) for shard in range(shards)], axis=1)
        asked = lists_per > 0
    vectors = (shares[lists] * valid[:, :, None]).sum(axis=1)  # (queries, shards)
    return Load(layout, shards, queries, asked.sum(axis=1), asked.sum(axis=0), lists_per.sum(axis=0),
                vectors.sum(axis=0))


def full_size_nodes(shares: np.ndarray, vectors: int, full_vectors: int, full_nlist: int, dim: int) -> dict[str, Any]:
    """Computed, not measured: each node's vectors at the full size (its share of the simulation's `vectors`,
    scaled up) and the bytes they take as IVF-Flat (float32 codes and int64 ids) with every centroid, which
    each node holds (the router's and the lists' own)."""
    held = shares.sum(axis=0) * (full_vectors / vectors)
    return {"vectors_per_node_max": int(held.max()), "vectors_per_node_min": int(held.min()),
            "ivf_flat_bytes_per_node_max": int(held.max() * (4 * dim + 8) + full_nlist * dim * 4)}


def mixture_vectors(n: int, dim: int, seed: int, clusters: int = 256, spread: float = 0.6) -> np.ndarray:
    """Unit vectors drawn around `clusters` random unit directions (an embedder's vectors lie in clumps
    on the sphere, not uniformly in a cube): the simulation's stand-in for real embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, clusters, n)] + spread / np.sqrt(dim) * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def scaled(scenario: str, scale: float, nlist_div: int) -> tuple[int, int]:
    """(vectors, nlist) of `scenario` scaled down: vectors x scale (at least 1000), nlist / nlist_div."""
    vectors, nlist = SCENARIOS[scenario]
    return max(1000, int(vectors * scale)), max(2, nlist // nlist_div)


def sampled_ivf(vectors: np.ndarray, centroids: np.ndarray, nprobe: int) -> faiss.IndexIVFFlat:
    """An IVF-Flat whose centroids are the given draws (k-means' own starting point, since training
    hundreds of thousands of lists is out of reach here), filled with `vectors`."""
    dim = vectors.shape[1]
    quantizer = faiss.IndexFlatL2(dim)
    quantizer.add(centroids)
    index = faiss.IndexIVFFlat(quantizer, dim, len(centroids))
    index.own_fields = True
    quantizer.this.disown()  # the index frees it
    index.add(vectors)
    index.nprobe = min(nprobe, len(centroids))
    return index


def _shard_process(path: str, conn: Connection) -> None:
    """One index node of the simulation: its shard's file, probed searches until told to stop."""
    from pipeline.centroid_search import ProbedSearch
    faiss.omp_set_num_threads(1)
    search = ProbedSearch(faiss.read_index(path))
    ivf = search.ivf
    asked = lists_scanned = vectors_scanned = 0
    while (message := conn.recv()) is not None:
        vectors, lists, k = message
        ids, distances = search.search(vectors, lists, k)
        asked += len(vectors)
        lists_scanned += sum(len(row) for row in lists)
        vectors_scanned += sum(ivf.invlists.list_size(lst) for row in lists for lst in row)
        conn.send((ids, distances))
    conn.send({"queries": asked, "lists": lists_scanned, "vectors": vectors_scanned, "pid": os.getpid()})


def simulate(index: faiss.IndexIVF, owners: np.ndarray, queries: np.ndarray, k: int = 10,
             batch: int = 32) -> dict[str, Any]:
    """The centroid shards of `index` (by `owners`) as one process each, searched through the router
    batch by batch; the merged top k checked against `index` itself, and each process's counts."""
    from builders.centroid_shards import empty_copy, split_index
    shards = int(owners.max()) + 1
    router = CentroidRouter(index.quantizer, owners, shards, index.nprobe)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="shard-sim-") as folder:
        template, paths = empty_copy(index), []
        for shard in range(shards):
            paths.append(str(Path(folder) / f"shard-{shard}.bin"))
            faiss.write_index(split_index(index, owners, shard, template), paths[-1])
        pipes = [context.Pipe() for _ in range(shards)]
        procs = [context.Process(target=_shard_process, args=(path, child), daemon=True)
                 for path, (_, child) in zip(paths, pipes)]
        for proc in procs:
            proc.start()
        try:
            equal = visited = 0
            for start in range(0, len(queries), batch):
                x = queries[start:start + batch]
                routes = router.route(x)
                for route in routes:  # every shard asked at once, then every answer read
                    pipes[route.shard][0].send((x[route.rows], route.lists, k))
                answers = [(route.rows, *pipes[route.shard][0].recv()) for route in routes]
                ids, distances = padded(*merge_routed(len(x), [(rows, i.tolist(), d.tolist())
                                                               for rows, i, d in answers], k), k)
                expected_distances, expected_ids = index.search(x, k)
                equal += int(((ids == expected_ids).all(axis=1) & (distances == expected_distances).all(axis=1)).sum())
                visited += sum(len(route.rows) for route in routes)
            for parent, _ in pipes:
                parent.send(None)
            counts = [parent.recv() for parent, _ in pipes]
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
    return {"shards": shards, "queries": len(queries), "processes": len({c["pid"] for c in counts}),
            "shards_per_query_mean": visited / len(queries), "top10_equal_to_unsharded": equal,
            "per_shard": counts}
