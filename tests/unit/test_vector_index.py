"""VectorIndex: mmap and in-memory loading, nprobe, search validation."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from pipeline.vector_index import VectorIndex, VectorIndexError

DIM, N, NLIST = 32, 2000, 16


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return np.random.default_rng(0).random((N, DIM), dtype=np.float32)


@pytest.fixture(scope="module")
def ivf_path(tmp_path_factory, vectors):
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, NLIST)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = 3
    path = tmp_path_factory.mktemp("index") / "faiss_index.bin"
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def flat_path(tmp_path_factory, vectors):
    index = faiss.IndexFlatL2(DIM)
    index.add(vectors[:100])
    path = tmp_path_factory.mktemp("flat") / "flat.bin"
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("mmap", [True, False])
def test_load_properties(ivf_path, mmap):
    index = VectorIndex.load(ivf_path, nprobe=8, mmap=mmap)
    assert (index.dim, index.ntotal, index.nprobe, index.nlist) == (DIM, N, 8, NLIST)
    assert index.is_mmap is mmap
    assert faiss.extract_index_ivf(index.index).nprobe == 8


def test_nprobe_none_keeps_stored_value_and_is_clamped(ivf_path):
    assert VectorIndex.load(ivf_path, nprobe=None).nprobe == 3
    assert VectorIndex.load(ivf_path, nprobe=1000).nprobe == NLIST
    with pytest.raises(ValueError):
        VectorIndex.load(ivf_path, nprobe=0)


@pytest.mark.parametrize("mmap", [True, False])
def test_vector_finds_itself_first(ivf_path, vectors, mmap):
    index = VectorIndex.load(ivf_path, nprobe=4, mmap=mmap)
    ids, distances = index.search(vectors[100:110], 10)
    assert ids.shape == distances.shape == (10, 10)
    assert ids.dtype == np.int64 and distances.dtype == np.float32
    assert ids[:, 0].tolist() == list(range(100, 110))
    assert np.allclose(distances[:, 0], 0.0)
    assert (np.diff(distances, axis=1) >= 0).all()


def test_mmap_and_memory_agree(ivf_path, vectors):
    queries = np.random.default_rng(1).random((20, DIM), dtype=np.float32)
    a = VectorIndex.load(ivf_path, nprobe=5, mmap=True).search(queries, 10)
    b = VectorIndex.load(ivf_path, nprobe=5, mmap=False).search(queries, 10)
    assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1])


def test_search_validation(ivf_path, vectors):
    index = VectorIndex.load(ivf_path)
    with pytest.raises(ValueError, match="dimension"):
        index.search(np.zeros((2, DIM + 1), dtype=np.float32), 5)
    with pytest.raises(ValueError, match="shape"):
        index.search(np.zeros(DIM, dtype=np.float32), 5)
    with pytest.raises(TypeError):
        index.search(np.zeros((2, DIM), dtype=np.int32), 5)
    with pytest.raises(TypeError):
        index.search(vectors[:2].tolist(), 5)
    with pytest.raises(ValueError, match="NaN"):
        index.search(np.full((1, DIM), np.nan, dtype=np.float32), 5)
    with pytest.raises(ValueError, match="k must"):
        index.search(vectors[:2], 0)


def test_search_converts_float64_and_non_contiguous(ivf_path, vectors):
    index = VectorIndex.load(ivf_path)
    expected, _ = index.search(vectors[:6:2], 3)
    assert np.array_equal(index.search(vectors[:6:2].astype(np.float64), 3)[0], expected)
    doubled = np.repeat(vectors[:6:2], 2, axis=1)[:, ::2]  # non-contiguous view
    assert np.array_equal(index.search(doubled, 3)[0], expected)


def test_empty_query_and_padding(ivf_path, vectors):
    index = VectorIndex.load(ivf_path, nprobe=1)
    ids, distances = index.search(np.empty((0, DIM), dtype=np.float32), 10)
    assert ids.shape == distances.shape == (0, 10)
    ids, _ = index.search(vectors[:1], N + 50)  # more than one list holds
    assert (ids[0] == -1).any()


def test_search_batch(ivf_path, vectors):
    index = VectorIndex.load(ivf_path)
    results = index.search_batch([vectors[7], vectors[8:9], vectors[9]], 4)
    ids, distances = index.search(vectors[7:10], 4)
    assert [r[0] for r in results] == ids.tolist()
    assert [r[1] for r in results] == distances.tolist()
    assert index.search_batch([], 4) == []


def test_non_ivf_index_falls_back_to_memory(flat_path, vectors, caplog):
    with caplog.at_level("INFO", logger="pipeline.vector_index"):
        index = VectorIndex.load(flat_path, nprobe=64, mmap=True)
    assert not index.is_mmap and index.nprobe is None
    assert "does not support mmap" in caplog.text
    assert index.search(vectors[5:6], 1)[0][0, 0] == 5


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="faiss index not found"):
        VectorIndex.load(tmp_path / "missing.bin")


def test_corrupt_file(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(VectorIndexError, match="cannot read faiss index"):
        VectorIndex.load(path)


def test_a_memory_mapped_index_starts_no_threads_to_prefetch_its_lists(ivf_path):
    """faiss's on-disk lists start `prefetch_nthread` threads (32 by default) at every search to touch the pages of
    the lists it probes: on a 2-vCPU EPYC 4.3 ms of the index node's CPU a search of one vector against 0.14 ms for
    the search itself (docs/performance.md, section 34). The pages are in the page cache after the first searches."""
    index = VectorIndex.load(ivf_path, nprobe=4, mmap=True)
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index.index).invlists)
    assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.prefetch_nthread == 0
