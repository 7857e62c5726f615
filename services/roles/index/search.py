"""Node 2's search service: the FAISS index behind a BatchingService of single vectors (faiss's
per-query cost falls with batch size), and the /search body's rules. Ids go back, never documents.
A batch closes at once when no other /search call received may still join it (the role's Upstream).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import faiss
import numpy as np

from pipeline import spec
from pipeline.centroid_search import ProbedSearch
from pipeline.data_version import Manifest
from pipeline.openmp_workers import hand_back_openmp_workers
from pipeline.vector_index import VectorIndex
from services.server import stage_spans
from services.server.errors import ApiError
from services.server.request_ids import current_request_id
from services.stages.batching import BatchingService
from services.stages.futures import results_by
from services.stages.upstream import Route, Upstream

MAX_SEARCH_VECTORS = 1024
MAX_K = 1024
MAX_SEARCH_BODY_BYTES = 32 * 1024 * 1024  # 1024 vectors of 768 floats as JSON text


def max_search_values(dim: int) -> int:
    """JSON values a valid /search body holds at most: every number, each row, the list, k and slack."""
    return MAX_SEARCH_VECTORS * (dim + 1) + 16


@dataclass(frozen=True)
class IndexQuery:
    vector: np.ndarray
    k: int
    lists: list[int] | None = None  # a centroid shard's lists to probe (services.roles.index.probe_lists)


class IndexService:
    def __init__(self, index: VectorIndex, *, max_size: int, max_wait_ms: float, max_queue: int, threads: int,
                 manifest: Manifest | None = None, owned_lists: frozenset[int] | None = None,
                 upstream: Upstream | None = None):
        """`threads`: faiss's OpenMP threads for the searches (FAISS_THREADS' budget), set in the thread that runs
        them: libgomp keeps a thread count per thread, and a new thread starts at the process's default."""
        self.index = index
        self.manifest = manifest  # the data version's: its recall, for /health and the metrics
        self.owned_lists = owned_lists  # a centroid shard's lists; None for a hash shard
        self.probed = ProbedSearch(index.index) if owned_lists is not None else None
        self.max_queue = max_queue
        self.batcher = BatchingService("index", stage_spans.noting_batches(self._search_batch), max_size=max_size,
                                       max_wait_ms=max_wait_ms, max_queue=max_queue, upstream=upstream,
                                       on_start=partial(faiss.omp_set_num_threads, threads),
                                       on_idle=hand_back_openmp_workers)

    def _search_batch(self, items: list[IndexQuery]) -> list[tuple[list[int], list[float]]]:
        k = max(item.k for item in items)
        if self.probed is not None:  # every item names its lists (the route refuses a body without)
            ids, distances = self.probed.search(np.stack([item.vector for item in items]),
                                                [item.lists or [] for item in items], k)
        else:
            ids, distances = self.index.search(np.stack([item.vector for item in items]), k)
        return [(ids[i, :item.k].tolist(), distances[i, :item.k].tolist()) for i, item in enumerate(items)]

    def search(self, vectors: np.ndarray, k: int, timeout_s: float,
               lists: list[list[int]] | None = None, route: Route | None = None) -> tuple[list, list]:
        """The ids and distances of each vector's `k` nearest; `route`: the call's, passed once it is queued."""
        started = time.monotonic()
        # Tracing on: the call's span in the index stage; its first vector reports the batch.
        span = stage_spans.start_stage("index", current_request_id.get())
        items = [IndexQuery(v, k, lists[i] if lists is not None else None) for i, v in enumerate(vectors)]
        if items:
            items[0] = stage_spans.noted(span, items[0])
        error: BaseException | None = None
        try:
            futures = self.batcher.submit_many(items)  # parse_search_body kept the count within the queue
            if route is not None:
                route.passed(spec.Stage.INDEX)  # all its vectors are in: the batch need not wait for this call
            results = results_by(futures, started + timeout_s, ApiError(504, "search timed out"))
        except BaseException as exc:
            error = exc
            raise
        finally:
            if span is not None:
                span.end(time.monotonic() - started, error, **{"rag.vectors": len(items)})
        return [r[0] for r in results], [r[1] for r in results]

    def close(self, timeout: float | None = None) -> None:
        self.batcher.close(timeout)


def _finite(x: int | float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond any float: JSON allows 400 digits
        return False


def search_vector_limit(max_queue: int) -> tuple[int, str]:
    """The most vectors one /search takes, and why: the body's rule, or the index's batching queue
    where that is smaller (a call's vectors are queued all at once)."""
    if max_queue < MAX_SEARCH_VECTORS:
        return max_queue, f"STAGE_MAX_QUEUE: the index's batching queue holds {max_queue}"
    return MAX_SEARCH_VECTORS, "MAX_SEARCH_VECTORS, the /search body's rule"


def parse_search_version(body: dict) -> str | None:
    """The data version a search reads: the body's "version" (a worker sends its request's), or None
    for the node's current one."""
    version = body.get("version")
    if version is not None and (not isinstance(version, str) or not version):
        raise ApiError(400, "'version' must be a data version's name (or left out: the current one)",
                       field="version")
    return version


def parse_search_body(body: dict, dim: int, max_queue: int) -> tuple[np.ndarray, int]:
    """Validate {"embeddings": [[dim floats], ...], "k": int}; ApiError(400) naming the problem.
    `max_queue`: the index's batching queue (search_vector_limit)."""
    k = body.get("k", spec.TOP_K)  # the contract's k when a caller leaves it out
    if type(k) is not int or not 1 <= k <= MAX_K:
        raise ApiError(400, f"'k' must be an integer from 1 to {MAX_K}", field="k")
    rows = body.get("embeddings")
    if not isinstance(rows, list) or not rows:
        raise ApiError(400, "'embeddings' must be a non-empty list of vectors", field="embeddings")
    limit, source = search_vector_limit(max_queue)
    if len(rows) > limit:
        raise ApiError(400, f"'embeddings' holds {len(rows)} vectors; at most {limit} are accepted ({source})",
                       field="embeddings")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != dim:
            got = len(row) if isinstance(row, list) else type(row).__name__
            raise ApiError(400, f"embeddings[{i}] must be a list of {dim} numbers, got {got}", field="embeddings")
        for x in row:
            if type(x) not in (int, float):
                raise ApiError(400, f"embeddings[{i}] holds a {type(x).__name__}, expected numbers",
                               field="embeddings")
            if not _finite(x):
                raise ApiError(400, f"embeddings[{i}] holds a non-finite number ({x})", field="embeddings")
    with np.errstate(over="ignore"):  # overflow is checked just below, as a 400
        vectors = np.asarray(rows, dtype=np.float32)
    if not np.isfinite(vectors).all():
        raise ApiError(400, "embeddings overflow float32", field="embeddings")
    return vectors, k
