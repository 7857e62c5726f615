"""profiling.shard_fanout's counts: shards asked, lists and vectors scanned per shard, hash against
centroid; and the tool end to end at a small size, with one process per simulated shard (slow)."""
from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from builders.data import build_course
from builders.recall import RecallOptions
from profiling import shard_fanout
from profiling.lib.shard_sim import count_load, full_size_nodes, scaled, shard_shares

# Uniform course vectors are under the recall floor at a small nprobe; what is tested here is
# equality with the unsharded index at the same nprobe, not recall.
LOW_RECALL_ACCEPTED = RecallOptions(accept_low=True)


def test_hash_shards_are_all_asked_and_centroid_shards_only_for_their_lists():
    probed = np.array([[0, 1], [2, 3], [0, 3]])
    shares = np.array([[5, 0], [3, 0], [0, 4], [0, 2]])  # 4 lists on 2 shards: lists 0, 1 on shard 0
    owners = np.array([0, 0, 1, 1])
    centroid = count_load("centroid", probed, shares, owners)
    assert centroid.visited.tolist() == [1, 1, 2]
    assert centroid.shard_queries.tolist() == [2, 2] and centroid.shard_lists.tolist() == [3, 3]
    assert centroid.shard_vectors.tolist() == [13, 8]
    hashed = count_load("hash", probed, np.array([[3, 2], [2, 1], [1, 3], [1, 1]]), None)
    assert hashed.visited.tolist() == [2, 2, 2] and hashed.shard_lists.tolist() == [6, 6]
    assert hashed.shard_vectors.tolist() == [3 + 2 + 1 + 1 + 3 + 1, 2 + 1 + 3 + 1 + 2 + 1]
    row = centroid.row()
    assert row["shards_per_query_mean"] == pytest.approx(4 / 3) and row["lists_per_query_all_shards"] == 2


def test_padding_lists_count_for_nothing():
    load = count_load("centroid", np.array([[1, -1]]), np.array([[2, 0], [0, 3]]), np.array([0, 1]))
    assert load.visited.tolist() == [1] and load.shard_vectors.tolist() == [0, 3]


def test_shares_split_each_list_by_doc_id_or_by_owner():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 8)).astype(np.float32)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(8), 8, 8)
    index.train(vectors)
    index.add(vectors)
    sizes = [index.invlists.list_size(lst) for lst in range(8)]
    hashed = shard_shares(index, 3, None)
    assert hashed.sum(axis=1).tolist() == sizes and hashed.sum(axis=0).tolist() == [167, 167, 166]
    owners = np.arange(8) % 2
    by_owner = shard_shares(index, 2, owners)
    assert by_owner[np.arange(8), owners].tolist() == sizes and by_owner.sum() == 500


def test_the_simulation_keeps_the_full_nlist_divided_and_scales_the_vectors():
    assert scaled("100M", 1e-4, 1) == (10_000, 65_536)
    assert scaled("1B", 1e-4, 4) == (100_000, 65_536)
    assert scaled("100M", 1e-9, 1_000_000) == (1000, 2)


def test_each_nodes_full_size_vectors_and_bytes_are_computed_from_its_share():
    shares = np.array([[3, 1], [1, 0]])  # 2 lists on 2 nodes: node 0 holds 4 of the 5 simulated vectors
    nodes = full_size_nodes(shares, 5, 1000, 8, 4)
    assert (nodes["vectors_per_node_min"], nodes["vectors_per_node_max"]) == (200, 800)
    assert nodes["ivf_flat_bytes_per_node_max"] == 800 * (4 * 4 + 8) + 8 * 4 * 4  # its vectors and ids, every centroid


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sim_vectors", ["clumps", "mixture"])
def test_the_tool_at_a_small_size(tmp_path, capsys, sim_vectors):
    build_course(tmp_path / "v1", 1500, nlist=32, nprobe=8, dim=16, progress=False, recall=LOW_RECALL_ACCEPTED)
    assert shard_fanout.main(["--data", str(tmp_path / "v1"), "--shards", "2,4", "--queries", "60", "--check", "30",
                              "--nprobe", "4", "--simulate", "--scale", "1e-5", "--sim-nlist-div", "2048",
                              "--sim-shards", "2", "--dim", "16", "--sim-vectors", sim_vectors,
                              "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "shard_fanout.json").read_text())
    rows = report["course"]["rows"]
    assert [(r["layout"], r["shards"]) for r in rows][:4] == [("hash", 2), ("centroid/kmeans", 2),
                                                             ("centroid/bisect", 2), ("centroid/greedy", 2)]
    for row in rows:
        if row["layout"] == "hash":
            assert row["shards_per_query_mean"] == row["shards"] and row["lists_per_query_all_shards"] == 4 * row["shards"]
        else:
            assert row["top10_equal"] == 30 and row["lists_per_query_all_shards"] == 4
            assert 1 <= row["shards_per_query_mean"] <= row["shards"]
    assert report["course"]["source"] == "uniform"  # what the version's manifest says it was built from
    for sim in report["simulation"]:
        assert sim["vectors_drawn"] == sim_vectors
        run = sim["processes"]
        assert run["processes"] == 2 and run["top10_equal_to_unsharded"] == run["queries"] == 60
        assert sum(c["queries"] for c in run["per_shard"]) == pytest.approx(run["shards_per_query_mean"] * 60)
        assert sum(c["lists"] for c in run["per_shard"]) == 60 * sim["nprobe"]
        hashed = sim["full_size_computed"]["hash"]  # doc_id % 2: half the full size's vectors a node
        assert hashed["vectors_per_node_max"] == pytest.approx(sim["full_size_vectors"] / 2, rel=0.01)
        assert sim["full_size_computed"]["centroid"]["vectors_per_node_max"] >= hashed["vectors_per_node_max"]
    out = capsys.readouterr().out
    assert "counted (no timings): 2 shard processes" in out and "computed for the full size (not measured)" in out


def test_a_query_asks_fewer_centroid_shards_of_a_mixture_course_build(tmp_path):
    # measured at this size (4 shards, nprobe 8 of 205 lists): kmeans-balanced centroid shards asked 2.0 a
    # query on mixture vectors, 3.3 on uniform ones; the top 10 equal the unsharded index's either way
    asked = {}
    for vectors in ("uniform", "mixture"):
        out = tmp_path / vectors
        assert shard_fanout.main(["--docs", "8000", "--vectors", vectors, "--course-dim", "32", "--shards", "4",
                                  "--nprobe", "8", "--queries", "200", "--check", "20", "--out", str(out)]) == 0
        course = json.loads((out / "shard_fanout.json").read_text())["course"]
        assert course["source"] == vectors
        kmeans = next(row for row in course["rows"] if row["layout"] == "centroid/kmeans")
        assert kmeans["top10_equal"] == kmeans["top10_checked"] == 20
        asked[vectors] = kmeans["shards_per_query_mean"]
    assert asked["mixture"] < 2.6 and asked["uniform"] > 3.0, asked
