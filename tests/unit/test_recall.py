"""Recall@10 of every build (builders.recall), the floor, tuning, and the index kinds (builders.index_kinds)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from builders.build_files import BuildError
from builders.data import build_course, course_vector_batches
from builders.index_kinds import InvalidBuildArgument, parse_index_spec
from builders.recall import LowRecall, RecallOptions, exact_top_k, recall_at, sample_queries
from pipeline.data_version import load_version, overall_recall, serving_params, shard_recall
from pipeline.vector_index import VectorIndex

DIM = 32
N = 1500
QUERIES = 150


def _vectors(n: int = N, seed: int = 0) -> np.ndarray:
    return next(course_vector_batches(n, DIM, seed, n))


def _independent_recall(paths, nprobe, queries_seed=0, n=N, shards=1):
    """recall@10 computed here from scratch: numpy's exact top 10 against the files' merged search."""
    x = _vectors(n)
    queries = sample_queries(lambda: iter([x]), n, QUERIES, queries_seed).vectors
    d = ((queries[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    exact = np.argsort(d, axis=1)[:, :10]
    found = [VectorIndex.load(p, nprobe=nprobe).search(queries, 10) for p in paths]
    ids = np.concatenate([f[0] for f in found], axis=1)
    dist = np.concatenate([f[1] for f in found], axis=1)
    merged = np.take_along_axis(ids, np.argsort(dist, axis=1, kind="stable")[:, :10], axis=1)
    return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(merged.tolist(), exact.tolist())])


def test_recall_at_counts_the_exact_neighbours_found():
    exact = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    served = np.array([[4, 3, 9, 9], [6, 7, 8, 9]])
    assert recall_at(served, exact) == pytest.approx((2 / 4 + 1 / 2) / 2)


def test_exact_top_k_per_shard_is_the_brute_force_answer():
    x = _vectors(400)
    queries = sample_queries(lambda: iter([x]), 400, 20, seed=3).vectors
    per_shard = exact_top_k(queries, lambda: (x[i : i + 64] for i in range(0, 400, 64)), shards=2, k=5)
    for shard, (ids, _) in enumerate(per_shard):
        rows = np.arange(shard, 400, 2)
        d = ((queries[:, None, :] - x[rows][None]) ** 2).sum(-1)
        assert ids.tolist() == rows[np.argsort(d, axis=1)[:, :5]].tolist()


def test_a_build_records_the_recall_it_measured(tmp_path):
    result = build_course(tmp_path / "v1", N, dim=DIM, nprobe=2, shards=2, progress=False, batch_size=400,
                          recall=RecallOptions(accept_low=True, queries=QUERIES))
    recall = result.manifest.index["recall"]
    assert recall["at"] == 10 and recall["queries"] == QUERIES and recall["params"] == {"nprobe": 2}
    assert recall["overall"] == pytest.approx(_independent_recall(result.index_files, 2, shards=2), abs=1e-4)
    assert 0 < recall["overall"] < 0.95 and recall["accepted_below_floor"] is True
    manifest = load_version(tmp_path / "v1")  # and it is what a node reads back
    assert overall_recall(manifest) == recall["overall"]
    assert [shard_recall(manifest, s) for s in (0, 1, 2)] == [*recall["shards"], None]


def test_an_exhaustive_search_has_recall_one(tmp_path):
    result = build_course(tmp_path / "v1", 600, dim=DIM, nlist=8, nprobe=8, progress=False,
                          recall=RecallOptions(queries=50))
    assert result.manifest.index["recall"]["overall"] == 1.0 and result.manifest.index["recall"]["shards"] == [1.0]


def test_a_build_under_the_floor_fails_naming_figure_and_floor_and_leaves_no_version(tmp_path):
    with pytest.raises(LowRecall, match=r"recall@10 0\.\d+ is under the floor 0\.9 .* at nprobe 1") as caught:
        build_course(tmp_path / "v1", N, dim=DIM, nprobe=1, progress=False, batch_size=500,
                     recall=RecallOptions(min_recall=0.9, queries=QUERIES))
    assert not (tmp_path / "v1" / "manifest.json").exists()
    assert not list((tmp_path / "v1").glob("*.bin"))
    accepted = build_course(tmp_path / "v2", N, dim=DIM, nprobe=1, progress=False, batch_size=500,
                            recall=RecallOptions(min_recall=0.9, queries=QUERIES, accept_low=True))
    figure = float(str(caught.value).split()[1])  # the figure named is the one measured
    assert figure == accepted.manifest.index["recall"]["overall"]
    assert figure == pytest.approx(_independent_recall(accepted.index_files, 1), abs=1e-4)


def test_tune_raises_nprobe_to_the_floor_and_the_node_serves_it(tmp_path):
    result = build_course(tmp_path / "v1", N, dim=DIM, nprobe=1, progress=False,
                          recall=RecallOptions(min_recall=0.9, tune=True, queries=QUERIES))
    index = result.manifest.index
    ladder = index["recall"]["tuned"]
    assert index["recall"]["overall"] >= 0.9 and ladder[-1]["recall"] >= 0.9
    assert all(step["recall"] < 0.9 for step in ladder[:-1])
    assert index["nprobe"] == ladder[-1]["nprobe"] > 1
    assert serving_params(result.manifest, None, None) == (index["nprobe"], None)
    assert serving_params(result.manifest, 3, 7) == (3, 7)  # a setting wins over the manifest
    assert _independent_recall(result.index_files, index["nprobe"]) >= 0.9


@pytest.mark.parametrize("spec", ["IVF,SQ8", "IVF8,PQ8", "OPQ4,IVF8,PQ4", "HNSW8,Flat"])
def test_every_kind_builds_sharded_and_finds_documents_by_their_doc_ids(tmp_path, spec):
    result = build_course(tmp_path / "v1", 800, dim=DIM, nlist=8, progress=False, shards=2, index=spec,
                          recall=RecallOptions(min_recall=0.5, tune=True, queries=60))
    index = result.manifest.index
    assert index["kind"] == parse_index_spec(spec, DIM).family and index["recall"]["overall"] >= 0.5
    x = _vectors(800)
    for shard, path in enumerate(result.index_files):
        vi = VectorIndex.load(path, nprobe=index.get("nprobe"), ef_search=index.get("ef_search"))
        assert vi.ntotal == 400
        rows = np.arange(shard, 800, 2)[:20]
        ids, _ = vi.search(x[rows], 1)
        assert np.mean(ids[:, 0] == rows) >= 0.9  # a document's own vector finds its doc_id
    if spec.startswith("HNSW"):
        assert vi.ef_search == index["ef_search"] and vi.nprobe is None
    else:
        assert vi.nprobe == index["nprobe"]


def test_ef_search_is_set_at_serve_time(tmp_path):
    result = build_course(tmp_path / "v1", 300, dim=DIM, progress=False, index="HNSW8,Flat",
                          recall=RecallOptions(queries=30, accept_low=True))
    assert VectorIndex.load(result.index_path, ef_search=123).ef_search == 123
    assert VectorIndex.load(result.index_path).ef_search == result.manifest.index["ef_search"]


@pytest.mark.parametrize("spec, rule", [("IVF,PQ5", "dividing the dimension"), ("OPQ8,IVF,PQ4", "same m"),
                                        ("LSH", "not an index kind"), ("HNSW1", "M from 2")])
def test_bad_index_specs_are_refused_naming_the_rule(spec, rule):
    with pytest.raises(InvalidBuildArgument, match=rule):
        parse_index_spec(spec, DIM)


def test_recall_options_refuse_a_floor_outside_zero_one():
    with pytest.raises(BuildError, match="--min-recall must be between 0 and 1"):
        RecallOptions(min_recall=1.5)


def test_the_manifest_json_holds_the_recall(tmp_path):
    build_course(tmp_path / "v1", 300, dim=DIM, progress=False, recall=RecallOptions(queries=30))
    recorded = json.loads((tmp_path / "v1" / "manifest.json").read_text())["index"]["recall"]
    assert recorded["reference"].startswith("exact") and recorded["floor"] == 0.95


def test_auto_builds_the_smallest_candidate_that_meets_the_floor(tmp_path):
    result = build_course(tmp_path / "v1", N, dim=DIM, progress=False, index="auto",
                          recall=RecallOptions(min_recall=0.9, tune=True, queries=QUERIES, latency_budget_ms=1e6))
    auto = result.manifest.index["auto"]
    fit = [c for c in auto["candidates"] if c["recall"] >= 0.9]
    assert len(auto["candidates"]) == 5 and fit
    assert auto["chosen"] == result.manifest.index["spec"] == min(fit, key=lambda c: c["bytes_estimated"])["spec"]
    assert result.manifest.index["recall"]["overall"] >= 0.9


def test_an_update_measures_its_recall_and_is_held_to_the_floor(tmp_path):
    from builders.incremental import Changes, update_version
    from builders.manifest import random_vectors
    from pipeline.docstore import Document
    build_course(tmp_path / "v1", N, dim=DIM, nprobe=2, shards=2, progress=False,
                 recall=RecallOptions(accept_low=True, queries=QUERIES))
    changes = Changes((Document(N + 1, "t", "new text", "c"),), (5, 6))
    new = np.random.default_rng(9).random((1, DIM), dtype=np.float32)

    def embed(texts):
        return new[: len(texts)]
    with pytest.raises(LowRecall, match="under the floor 0.99"):
        update_version(tmp_path / "v1", tmp_path / "v2", changes, embed, random_vectors(DIM),
                       recall=RecallOptions(min_recall=0.99, queries=QUERIES))
    assert not (tmp_path / "v2" / "manifest.json").exists()
    result = update_version(tmp_path / "v1", tmp_path / "v2", changes, embed, random_vectors(DIM), force=True,
                            recall=RecallOptions(accept_low=True, queries=QUERIES))
    recall = result.manifest.index["recall"]
    assert recall["params"] == {"nprobe": 2} and len(recall["shards"]) == 2 and 0 < recall["overall"] < 0.99


def test_a_built_version_is_tuned_without_a_rebuild_and_its_manifest_records_it(tmp_path):
    from builders.recall import main as recall_main
    result = build_course(tmp_path / "v1", N, dim=DIM, nprobe=1, shards=2, progress=False,
                          recall=RecallOptions(accept_low=True, queries=QUERIES))
    before = {path.name: path.read_bytes() for path in result.index_files}
    assert recall_main(["tune", str(tmp_path / "v1"), "--min-recall", "0.9", "--recall-queries", str(QUERIES)]) == 0
    manifest = load_version(tmp_path / "v1")
    assert manifest.index["nprobe"] > 1 and manifest.index["recall"]["overall"] >= 0.9
    assert manifest.index["recall"]["params"] == {"nprobe": manifest.index["nprobe"]}
    assert {path.name: path.read_bytes() for path in result.index_files} == before  # no rebuild
    assert serving_params(manifest, None, None)[0] == manifest.index["nprobe"]
