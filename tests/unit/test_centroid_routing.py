"""Centroid shards searched in one process: the list owners, the router, the probed search and the
merge give the unsharded IVF index's top 10, ids and distances, at 2, 4 and 8 shards."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from builders.centroid_shards import list_sizes, split_index
from pipeline.centroid_routing import CentroidRouter, assign_lists, merge_routed
from pipeline.centroid_search import CentroidShardedIndex, ProbedSearch

DIM, DOCS, NLIST, NPROBE, K = 16, 4000, 64, 8, 10


def trained(vectors: np.ndarray, nprobe: int = NPROBE) -> faiss.IndexIVFFlat:
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, NLIST)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = nprobe
    return index


def centroid_sharded(index: faiss.IndexIVFFlat, shards: int, method: str) -> CentroidShardedIndex:
    owners = assign_lists(index.quantizer.reconstruct_n(0, NLIST), list_sizes(index), shards, method)
    router = CentroidRouter(index.quantizer, owners, shards, index.nprobe)
    return CentroidShardedIndex(router, [split_index(index, owners, shard) for shard in range(shards)])


@pytest.fixture(scope="module")
def gaussian():
    """Seeded Gaussian vectors with 40 copies of vector 7 (ties at distance 0 past the 10th place, all in
    one list), and queries: documents perturbed, the duplicated vector itself, and fresh draws."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((DOCS, DIM)).astype(np.float32)
    vectors[200:240] = vectors[7]
    queries = np.vstack([vectors[:60] + 0.01 * rng.standard_normal((60, DIM)).astype(np.float32),
                         vectors[[7, 7, 210]], rng.standard_normal((40, DIM)).astype(np.float32)])
    return vectors, queries


@pytest.fixture(scope="module")
def gaussian_index(gaussian):
    return trained(gaussian[0])


@pytest.mark.parametrize("method", ["kmeans", "bisect", "greedy"])
@pytest.mark.parametrize("shards", [2, 4, 8])
def test_the_top_10_is_the_unsharded_indexs_ids_and_distances(gaussian, gaussian_index, shards, method):
    queries, index = gaussian[1], gaussian_index
    expected_distances, expected_ids = index.search(queries, K)
    ids, distances = centroid_sharded(index, shards, method).search(queries, K)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(distances, expected_distances)
    assert (expected_distances[60] == 0).all() and set(expected_ids[60]) <= {7, *range(200, 240)}  # the ties


def test_queries_whose_lists_fall_in_one_shard_visit_only_it(gaussian, gaussian_index):
    queries, index = gaussian[1], gaussian_index
    sharded = centroid_sharded(index, 2, "bisect")
    lists = sharded.router.probe_lists(queries)
    visited = np.array([len(set(sharded.router.owners[row])) for row in lists])
    assert (visited == 1).any() and (visited == 2).any()  # both kinds are in the seeded sample
    routes = sharded.router.route(queries)
    asked = np.zeros(len(queries), dtype=int)
    for route in routes:
        asked[route.rows] += 1
        for row, row_lists in zip(route.rows, route.lists):
            assert row_lists == [lst for lst in lists[row] if sharded.router.owners[lst] == route.shard]  # probe order
    np.testing.assert_array_equal(asked, visited)
    one = np.flatnonzero(visited == 1)
    expected_distances, expected_ids = index.search(queries[one], K)
    ids, distances = sharded.search(queries[one], K)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(distances, expected_distances)


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_equal_distances_in_different_lists(shards):
    """Integer vectors: many exact ties, across lists and shards. Distances always equal faiss's; the ids
    equal faiss's everywhere but among the vectors tied at the 10th distance, where faiss keeps the one it
    scanned first and the merge the smallest id, both at that very distance."""
    rng = np.random.default_rng(1)
    vectors = rng.integers(0, 3, (DOCS, DIM)).astype(np.float32)
    queries = np.vstack([vectors[:50], rng.integers(0, 3, (50, DIM)).astype(np.float32)])
    index = trained(vectors)
    expected_distances, expected_ids = index.search(queries, K)
    ids, distances = centroid_sharded(index, shards, "bisect").search(queries, K)
    np.testing.assert_array_equal(distances, expected_distances)
    inside = distances < distances[:, -1:]
    np.testing.assert_array_equal(ids[inside], expected_ids[inside])  # ties inside the top 10: same order (by id)
    assert (ids[inside] != -1).all() and inside.sum() > 300 and (ids != expected_ids).any()
    at_edge = ~inside
    for row, col in zip(*np.nonzero(at_edge)):
        assert ((vectors[ids[row, col]] - queries[row]) ** 2).sum() == distances[row, col]


def test_nprobe_one_visits_one_shard_and_equals_the_unsharded(gaussian):
    vectors, queries = gaussian
    index = trained(vectors, nprobe=1)
    sharded = centroid_sharded(index, 8, "bisect")
    assert all(len(route.rows) for route in sharded.router.route(queries))
    assert sum(len(route.rows) for route in sharded.router.route(queries)) == len(queries)
    expected_distances, expected_ids = index.search(queries, K)
    ids, distances = sharded.search(queries, K)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(distances, expected_distances)


@pytest.mark.parametrize("method", ["kmeans", "bisect", "greedy"])
@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_every_list_has_one_owner_and_the_shards_are_balanced_by_list_sizes(gaussian_index, shards, method):
    index = gaussian_index
    sizes = list_sizes(index)
    owners = assign_lists(index.quantizer.reconstruct_n(0, NLIST), sizes, shards, method)
    assert owners.shape == (NLIST,) and set(owners.tolist()) == set(range(shards))
    loads = np.bincount(owners, weights=sizes + 1, minlength=shards)
    if method == "kmeans":  # at most 2% over its share, plus one list
        assert loads.max() <= loads.sum() / shards * 1.02 + sizes.max() + 1
    else:  # each split misses its share by at most one list: a shard is off by a list per level at most
        assert np.abs(loads - loads.sum() / shards).max() <= (sizes.max() + 1) * max(1, int(np.ceil(np.log2(shards))))
    np.testing.assert_array_equal(owners, assign_lists(index.quantizer.reconstruct_n(0, NLIST), sizes, shards, method))


def test_kmeans_and_bisect_keep_neighbouring_lists_together_more_than_greedy():
    """Clumped unit vectors (profiling.lib.shard_sim's mixture): a query's 4 nearest of 256 lists."""
    from profiling.lib.shard_sim import mixture_vectors
    drawn = mixture_vectors(256 + 200, 32, seed=0, clusters=32)
    centroids, queries = drawn[:256], drawn[256:]
    quantizer = faiss.IndexFlatL2(32)
    quantizer.add(centroids)
    lists = quantizer.search(queries, 4)[1]
    fan_out = {method: np.mean([len(set(assign_lists(centroids, np.ones(256), 8, method)[row])) for row in lists])
               for method in ("kmeans", "bisect", "greedy")}
    assert fan_out["kmeans"] < 2 and fan_out["kmeans"] < fan_out["bisect"] < fan_out["greedy"] <= 8, fan_out


@pytest.mark.parametrize("shards, sizes, method, message", [
    (0, [1, 2], "bisect", "1 to nlist"), (3, [1, 2], "bisect", "1 to nlist"), (2, [1], "bisect", "list sizes"),
    (2, [1, 2], "random", "method")])
def test_bad_layouts_are_refused(shards, sizes, method, message):
    with pytest.raises(ValueError, match=message):
        assign_lists(np.zeros((2, 4), dtype=np.float32), np.array(sizes), shards, method)


def test_a_router_refuses_owners_that_do_not_fit():
    quantizer = faiss.IndexFlatL2(4)
    quantizer.add(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError, match="4 centroids but 3 lists"):
        CentroidRouter(quantizer, np.zeros(3), 2, 1)
    with pytest.raises(ValueError, match="shards 0 to 1"):
        CentroidRouter(quantizer, np.array([0, 1, 2, 0]), 2, 1)
    assert CentroidRouter(quantizer, np.array([0, 1, 1, 0]), 2, 99).nprobe == 4


def test_the_merge_drops_padding_orders_ties_by_id_and_leaves_unasked_rows_empty():
    answers = [(np.array([0, 2]), [[5, 3, -1], [9, -1, -1]], [[1.0, 2.0, 3e38], [0.5, 3e38, 3e38]]),
               (np.array([0]), [[4, 1]], [[1.0, 2.0]])]
    ids, distances = merge_routed(3, answers, 3)
    assert ids == [[4, 5, 1], [], [9]] and distances == [[1.0, 1.0, 2.0], [], [0.5]]
    with pytest.raises(ValueError, match="k must be"):
        merge_routed(1, [], 0)


def test_a_probed_search_with_no_lists_finds_nothing(gaussian, gaussian_index):
    ids, distances = ProbedSearch(gaussian_index).search(gaussian[1][:2], [[], []], K)
    assert (ids == -1).all() and ids.shape == (2, K) and distances.shape == (2, K)
