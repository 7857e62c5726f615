"""The index node's search service runs faiss at its own thread count (FAISS_THREADS' budget) in the thread that
searches: libgomp keeps a thread count per thread, and one set elsewhere (the node's main thread) is not the
search thread's."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from pipeline.vector_index import VectorIndex
from services.roles.index.search import IndexService

DIM = 16


class CountingIndex:
    """A VectorIndex that notes the faiss thread count of the thread each search runs on."""

    def __init__(self, index: VectorIndex):
        self.index = index.index
        self._inner = index
        self.counts: list[int] = []

    def search(self, embeddings, k):
        self.counts.append(faiss.omp_get_max_threads())
        return self._inner.search(embeddings, k)


@pytest.fixture()
def index(tmp_path) -> VectorIndex:
    vectors = np.random.default_rng(0).random((500, DIM), dtype=np.float32)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, 4)
    ivf.train(vectors)
    ivf.add(vectors)
    faiss.write_index(ivf, str(tmp_path / "faiss_index.bin"))
    return VectorIndex.load(tmp_path / "faiss_index.bin", nprobe=4)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_searches_run_at_the_services_thread_count_whatever_the_callers(index, threads):
    counting = CountingIndex(index)
    service = IndexService(counting, max_size=8, max_wait_ms=1, max_queue=64, threads=threads)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2 if threads != 2 else 1)  # the caller's own count, unlike the service's
    try:
        vectors = np.random.default_rng(1).random((3, DIM), dtype=np.float32)
        ids, _ = service.search(vectors, 5, timeout_s=30)
        assert [len(row) for row in ids] == [5, 5, 5]
        assert counting.counts and set(counting.counts) == {threads}
    finally:
        faiss.omp_set_num_threads(before)
        service.batcher.close(5.0)
