"""Shards: file names, the disjoint assignment, the merge (exact for flat; IVF per its quantizer), file problems."""
from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.shards import (
    PADDING_DISTANCE,
    document_shard,
    merge_arrays,
    merge_batch,
    merge_top_k,
    shard_file_problems,
    shard_path,
)


def flat_index(vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    index = faiss.IndexIDMap(faiss.IndexFlatL2(vectors.shape[1]))
    index.add_with_ids(vectors, ids.astype(np.int64))
    return index


def sharded_search(make_index, vectors: np.ndarray, queries: np.ndarray, shards: int, k: int):
    """Build one index per shard (by document_shard over ids 0..n-1), search each, merge."""
    all_ids = np.arange(len(vectors))
    answers = []
    for shard in range(shards):
        ids = all_ids[document_shard(all_ids, shards) == shard]
        distances, found = make_index(vectors[ids], ids).search(queries, k)
        answers.append((found, distances))
    return merge_arrays(answers, k)


# ---------------------------------------------------------------- paths and assignment


def test_shard_path_names():
    assert shard_path("/data/faiss_index.bin", 0, 2) == Path("/data/faiss_index.shard-0-of-2.bin")
    assert shard_path(Path("idx/faiss_index.bin"), 11, 12) == Path("idx/faiss_index.shard-11-of-12.bin")
    assert shard_path("/data/faiss_index.bin", 0, 1) == Path("/data/faiss_index.bin")
    assert shard_path("/data/index", 1, 3) == Path("/data/index.shard-1-of-3")


@pytest.mark.parametrize("shard, shards", [(2, 2), (-1, 2), (0, 0), (0, True)])
def test_shard_path_rejects_bad_numbers(shard, shards):
    with pytest.raises(ValueError):
        shard_path("faiss_index.bin", shard, shards)


def test_document_shard_is_a_disjoint_cover():
    ids = np.arange(1000)
    owners = document_shard(ids, 3)
    assert owners.tolist() == [i % 3 for i in range(1000)]
    assert sorted(np.concatenate([ids[owners == s] for s in range(3)]).tolist()) == ids.tolist()
    assert document_shard(7, 1) == 0
    with pytest.raises(ValueError):
        document_shard(7, 0)


# ---------------------------------------------------------------- merge


def test_merge_orders_by_distance_and_drops_padding():
    shard0 = ([4, 8, -1], [0.5, 2.0, np.inf])
    shard1 = ([1, 3, 5], [0.1, 0.7, 3.0])
    assert merge_top_k([shard0, shard1], 4) == ([1, 4, 3, 8], [0.1, 0.5, 0.7, 2.0])
    assert merge_top_k([shard0, shard1], 10) == ([1, 4, 3, 8, 5], [0.1, 0.5, 0.7, 2.0, 3.0])


def test_merge_breaks_ties_by_shard_then_rank():
    shard0 = ([6, 2], [1.0, 1.0])
    shard1 = ([9, 3], [1.0, 0.5])
    assert merge_top_k([shard0, shard1], 3) == ([3, 6, 2], [0.5, 1.0, 1.0])
    assert merge_top_k([shard1, shard0], 3) == ([3, 9, 6], [0.5, 1.0, 1.0])


def test_merge_keeps_a_repeated_id_once_at_its_best():
    assert merge_top_k([([7, 1], [0.2, 0.9]), ([7, 2], [0.2, 0.3])], 3) == ([7, 2, 1], [0.2, 0.3, 0.9])


def test_merge_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        merge_top_k([([1], [0.1])], 0)
    with pytest.raises(ValueError, match="1 ids but 2 distances"):
        merge_top_k([([1], [0.1, 0.2])], 3)
    with pytest.raises(ValueError, match="different numbers of queries"):
        merge_batch([[([1], [0.1])], []], 3)


def test_merge_batch_is_per_query():
    shard0 = [([1], [0.3]), ([2], [0.1])]
    shard1 = [([3], [0.2]), ([4], [0.4])]
    assert merge_batch([shard0, shard1], 2) == [([3, 1], [0.2, 0.3]), ([2, 4], [0.1, 0.4])]


def test_merge_arrays_pads_like_faiss():
    ids, distances = merge_arrays([(np.array([[5, -1]]), np.array([[0.5, np.inf]], dtype=np.float32))], 3)
    assert ids.tolist() == [[5, -1, -1]] and distances.tolist() == [[0.5, PADDING_DISTANCE, PADDING_DISTANCE]]
    assert ids.dtype == np.int64 and distances.dtype == np.float32


# ---------------------------------------------------------------- merged search equals unsharded (flat)


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k", [1, 10, 25])
def test_flat_sharded_search_equals_unsharded(shards, k):
    rng = np.random.default_rng(shards * 100 + k)
    vectors = rng.random((600, 24), dtype=np.float32)
    queries = rng.random((40, 24), dtype=np.float32)  # over faiss's BLAS threshold (20 queries)
    distances, ids = flat_index(vectors, np.arange(600)).search(queries, k)
    merged_ids, merged_distances = sharded_search(flat_index, vectors, queries, shards, k)
    assert np.array_equal(merged_ids, ids)
    assert np.array_equal(merged_distances, distances)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), dim=st.integers(1, 16), shards=st.integers(1, 9), k=st.integers(1, 30),
       queries=st.integers(1, 25), seed=st.integers(0, 2**32 - 1))
def test_flat_sharded_search_equals_unsharded_randomized(n, dim, shards, k, queries, seed):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    q = rng.standard_normal((queries, dim)).astype(np.float32)
    distances, ids = flat_index(vectors, np.arange(n)).search(q, k)
    merged_ids, merged_distances = sharded_search(flat_index, vectors, q, shards, k)
    assert np.array_equal(merged_ids, ids)  # k > n: both padded with -1 the same way
    assert np.array_equal(merged_distances, distances)


# ---------------------------------------------------------------- IVF


def ivf_setup(n=3000, dim=16, nlist=30, seed=3):
    rng = np.random.default_rng(seed)
    vectors = rng.random((n, dim), dtype=np.float32)
    queries = rng.random((50, dim), dtype=np.float32)
    trained = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, nlist)
    trained.train(vectors)
    trained.nprobe = 3
    return vectors, queries, trained


@pytest.mark.parametrize("shards", [2, 3])
def test_ivf_shards_sharing_the_quantizer_equal_unsharded(shards):
    # What builders.data build --shards writes: every shard keeps the unsharded build's centroids.
    vectors, queries, trained = ivf_setup()

    def shared(x, ids):
        index = faiss.clone_index(trained)
        index.add_with_ids(x, ids.astype(np.int64))
        return index

    distances, ids = shared(vectors, np.arange(len(vectors))).search(queries, 10)
    merged_ids, merged_distances = sharded_search(shared, vectors, queries, shards, 10)
    assert np.array_equal(merged_ids, ids) and np.array_equal(merged_distances, distances)


def test_ivf_shards_with_their_own_quantizers_return_true_distances_but_may_differ():
    # Each shard trained on its own vectors probes its own lists: results may differ from the
    # unsharded IVF index (no equality asserted), but each hit is a real neighbour, correctly ranked.
    vectors, queries, trained = ivf_setup()

    def own(x, ids):
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(x.shape[1]), x.shape[1], trained.nlist)
        index.train(x)
        index.nprobe = trained.nprobe
        index.add_with_ids(x, ids.astype(np.int64))
        return index

    merged_ids, merged_distances = sharded_search(own, vectors, queries, 3, 10)
    assert (merged_ids >= 0).all() and (np.diff(merged_distances, axis=1) >= 0).all()
    true = ((vectors[merged_ids] - queries[:, None, :]) ** 2).sum(axis=2)
    assert np.allclose(merged_distances, true, rtol=1e-4, atol=1e-5)
    assert all(len(set(row)) == 10 for row in merged_ids.tolist())


# ---------------------------------------------------------------- files


def touch(path: Path) -> Path:
    path.write_bytes(b"index")
    return path


def test_shard_files_complete(tmp_path):
    index = tmp_path / "faiss_index.bin"
    for k in range(3):
        touch(shard_path(index, k, 3))
    assert shard_file_problems(index, 3) == []


def test_missing_shard_files_are_named(tmp_path):
    index = tmp_path / "faiss_index.bin"
    touch(shard_path(index, 1, 3))
    assert shard_file_problems(index, 3) == [
        f"shard 0 of 3 is missing: {tmp_path / 'faiss_index.shard-0-of-3.bin'}",
        f"shard 2 of 3 is missing: {tmp_path / 'faiss_index.shard-2-of-3.bin'}",
    ]


def test_shards_of_another_count_are_named(tmp_path):
    index = tmp_path / "faiss_index.bin"
    touch(shard_path(index, 0, 2))
    touch(shard_path(index, 1, 2))
    touch(tmp_path / "faiss_index.shard-1-of-4.bin")
    touch(tmp_path / "other.shard-0-of-4.bin")  # another index's shard: not ours
    assert shard_file_problems(index, 2) == [
        f"{tmp_path / 'faiss_index.shard-1-of-4.bin'} is shard 1 of a 4-shard build, but INDEX_SHARDS=2"]


def test_unsharded_index_beside_missing_shards_is_pointed_out(tmp_path):
    index = touch(tmp_path / "faiss_index.bin")
    problems = shard_file_problems(index, 2)
    assert problems[:2] == [f"shard {k} of 2 is missing: {shard_path(index, k, 2)}" for k in range(2)]
    assert "INDEX_SHARDS=1" in problems[2] and "--shards 2" in problems[2]


def test_one_shard_is_the_unsharded_file(tmp_path):
    index = tmp_path / "faiss_index.bin"
    assert shard_file_problems(index, 1) == [f"the index file is missing: {index}"]
    touch(index)
    assert shard_file_problems(index, 1) == []
    touch(shard_path(index, 0, 2))
    assert shard_file_problems(index, 1) == [
        f"{shard_path(index, 0, 2)} is shard 0 of a 2-shard build, but INDEX_SHARDS=1"]
    assert shard_file_problems(tmp_path / "absent" / "faiss_index.bin", 1) == [
        f"the index file is missing: {tmp_path / 'absent' / 'faiss_index.bin'}"]
