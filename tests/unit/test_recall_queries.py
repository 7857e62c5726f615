"""A built version re-tuned from the recall queries its build kept (builders.recall_queries): every kind,
hash and centroid shards, without the vectors; the file verified as the index files are."""
from __future__ import annotations

import json

import numpy as np
import pytest

from builders import recall, recall_queries
from builders.centroid_shards import split_version
from builders.data import build_course, course_vector_batches
from builders.incremental import Changes, update_version
from builders.manifest import main as verify_main
from builders.manifest import random_vectors
from builders.recall import RecallOptions, sample_queries
from builders.recall import main as recall_main
from pipeline.data_version import load_version, serving_params
from pipeline.docstore import Document
from pipeline.vector_index import VectorIndex

DIM = 32
N = 1500
QUERIES = 150
FLOOR = 0.95
LOW = RecallOptions(accept_low=True, queries=QUERIES)


def _vectors(n: int = N) -> np.ndarray:
    return next(course_vector_batches(n, DIM, 0, n))


def _recall_from_scratch(paths, nprobe=None, ef_search=None) -> float:
    """recall@10 of the files' merged search against numpy's exact top 10, on the queries a build samples."""
    x = _vectors()
    queries = sample_queries(lambda: iter([x]), N, QUERIES, 0).vectors
    exact = np.argsort(((queries[:, None, :] - x[None, :, :]) ** 2).sum(-1), axis=1)[:, :10]
    found = [VectorIndex.load(p, nprobe=nprobe, ef_search=ef_search).search(queries, 10) for p in paths]
    ids, dist = (np.concatenate([f[i] for f in found], axis=1) for i in (0, 1))
    merged = np.take_along_axis(ids, np.argsort(dist, axis=1, kind="stable")[:, :10], axis=1)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(merged.tolist(), exact.tolist())]))


@pytest.fixture
def no_vectors(monkeypatch):
    """Reading a version's vectors back fails: a tune must not need them."""
    def refuse(paths):
        raise AssertionError("the vectors were read back")
    monkeypatch.setattr(recall, "stored_batches", refuse)


def _tune(version_dir) -> int:
    return recall_main(["tune", str(version_dir), "--min-recall", str(FLOOR)])


@pytest.mark.parametrize("spec, build, name", [
    ("IVF,SQ8", {"nlist": 16, "nprobe": 1}, "nprobe"),
    ("IVF8,PQ8", {"nprobe": 1}, "nprobe"),  # refined exactly (IndexRefineFlat)
    ("HNSW4,Flat", {}, "ef_search"),  # built at efSearch 64: 0.94 here
])
def test_every_kind_is_tuned_to_the_floor_from_its_kept_queries(tmp_path, no_vectors, spec, build, name):
    result = build_course(tmp_path / "v1", N, dim=DIM, progress=False, shards=2, index=spec, recall=LOW, **build)
    built = result.manifest.index
    assert built["recall"]["overall"] < FLOOR and (tmp_path / "v1" / "recall_queries.npz").is_file()
    before = {path.name: path.read_bytes() for path in result.index_files}
    assert _tune(tmp_path / "v1") == 0
    manifest = load_version(tmp_path / "v1")
    index, recall = manifest.index, manifest.index["recall"]
    assert index[name] > built[name] and recall["params"] == {name: index[name]}
    assert recall["overall"] >= FLOOR and len(recall["shards"]) == 2 and recall["tuned"][-1][name] == index[name]
    assert {path.name: path.read_bytes() for path in result.index_files} == before  # no rebuild
    served = {"nprobe": index[name]} if name == "nprobe" else {"ef_search": index[name]}
    assert recall["overall"] == pytest.approx(_recall_from_scratch(result.index_files, **served), abs=1e-4)
    nprobe, ef_search = serving_params(manifest, None, None)  # what an index node opens its shard with
    opened = VectorIndex.load(result.index_files[1], nprobe=nprobe, ef_search=ef_search)
    assert getattr(opened, name) == index[name]


def test_the_index_node_serves_the_tuned_ef_search_and_shows_its_recall(tmp_path, no_vectors):
    from tests.helpers import index_node_app
    build_course(tmp_path / "v1", N, dim=DIM, progress=False, index="HNSW4,Flat", recall=LOW)
    assert _tune(tmp_path / "v1") == 0
    tuned = load_version(tmp_path / "v1").index
    with index_node_app(tmp_path / "v1" / "faiss_index.bin") as (_, client):
        health = client.get("/health").get_json()
    assert health["ef_search"] == tuned["ef_search"] > 64
    assert health["recall_at_10"] == tuned["recall"]["shards"][0] >= FLOOR
    assert health["recall_params"] == {"ef_search": tuned["ef_search"]}


def test_centroid_shards_are_tuned_as_the_index_they_were_split_from(tmp_path, no_vectors):
    result = build_course(tmp_path / "v1", N, dim=DIM, nlist=16, nprobe=1, progress=False, index="IVF,SQ8",
                          recall=LOW)
    split_version(tmp_path / "v1", 2)
    assert _tune(tmp_path / "v1") == 0
    manifest = load_version(tmp_path / "v1")
    nprobe = manifest.index["nprobe"]
    assert nprobe > 1 and manifest.index["recall"]["overall"] >= FLOOR
    shard_files = recall_queries.shard_files(tmp_path / "v1", manifest)
    assert len(shard_files) == 2 and result.index_path not in shard_files  # the quantizer is no shard
    # Their merged search is the unsharded index's, whose recall the build's queries were answered for.
    assert manifest.index["recall"]["overall"] == pytest.approx(_recall_from_scratch(shard_files, nprobe), abs=1e-4)
    assert verify_main(["verify", str(tmp_path / "v1")]) == 0


def test_an_altered_queries_file_fails_verify_and_is_not_tuned_against(tmp_path, capsys):
    build_course(tmp_path / "v1", N, dim=DIM, nlist=16, nprobe=1, progress=False, index="IVF,SQ8", recall=LOW)
    path = tmp_path / "v1" / "recall_queries.npz"
    assert verify_main(["verify", str(tmp_path / "v1")]) == 0
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_main(["verify", str(tmp_path / "v1")]) == 1
    assert "recall_queries.npz is not the file the build wrote" in capsys.readouterr().err
    assert _tune(tmp_path / "v1") == 2
    assert "recall_queries.npz is not the file the build wrote" in capsys.readouterr().err
    assert load_version(tmp_path / "v1").index["nprobe"] == 1  # the manifest untouched
    path.unlink()
    assert verify_main(["verify", str(tmp_path / "v1")]) == 1
    assert "recall_queries.npz is missing" in capsys.readouterr().err


def _as_before_queries_were_kept(version_dir) -> None:
    (version_dir / "recall_queries.npz").unlink()
    manifest = json.loads((version_dir / "manifest.json").read_text())
    del manifest["recall_queries"]
    (version_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_version_without_kept_queries_tunes_ivf_flat_from_its_lists_and_refuses_other_kinds(tmp_path, capsys):
    build_course(tmp_path / "v1", N, dim=DIM, nlist=16, nprobe=1, shards=2, progress=False, recall=LOW)
    _as_before_queries_were_kept(tmp_path / "v1")
    assert verify_main(["verify", str(tmp_path / "v1")]) == 0  # nothing it names is missing
    assert _tune(tmp_path / "v1") == 0
    index = load_version(tmp_path / "v1").index
    assert index["nprobe"] > 1 and index["recall"]["overall"] >= FLOOR
    build_course(tmp_path / "v2", N, dim=DIM, nlist=16, nprobe=1, progress=False, index="IVF,SQ8", recall=LOW)
    _as_before_queries_were_kept(tmp_path / "v2")
    assert _tune(tmp_path / "v2") == 2
    err = capsys.readouterr().err
    assert "names no recall queries (recall_queries.npz" in err and "IVF16,SQ8" in err


def test_an_update_keeps_its_own_queries_and_is_tuned_from_them(tmp_path, no_vectors):
    build_course(tmp_path / "v1", N, dim=DIM, nlist=16, nprobe=1, shards=2, progress=False, recall=LOW)
    new = np.full((1, DIM), 0.5, dtype=np.float32)
    update_version(tmp_path / "v1", tmp_path / "v2", Changes((Document(N + 1, "t", "c", "g"),), (5,)),
                   lambda texts: new[: len(texts)], random_vectors(DIM), recall=LOW)
    manifest = load_version(tmp_path / "v2")
    assert manifest.recall_queries["file"] == "recall_queries.npz"
    assert manifest.recall_queries["sha256"] != load_version(tmp_path / "v1").recall_queries["sha256"]
    _, exact = recall_queries.load_queries(tmp_path / "v2" / "recall_queries.npz")
    assert len(exact) == 2 and not any(5 in ids for ids, _ in exact)  # answered over v2's vectors
    assert _tune(tmp_path / "v2") == 0
    index = load_version(tmp_path / "v2").index
    assert index["nprobe"] > 1 and index["recall"]["overall"] >= FLOOR


def test_a_centroid_version_without_kept_queries_tunes_from_its_lists(tmp_path):
    build_course(tmp_path / "v1", N, dim=DIM, nlist=16, nprobe=1, progress=False, recall=LOW)
    split_version(tmp_path / "v1", 2)
    _as_before_queries_were_kept(tmp_path / "v1")
    assert _tune(tmp_path / "v1") == 0
    recall = load_version(tmp_path / "v1").index["recall"]
    assert recall["params"]["nprobe"] > 1 and recall["overall"] >= FLOOR and recall["shards"] == [recall["overall"]]


def test_a_version_rebuilt_without_queries_keeps_no_earlier_queries_file(tmp_path):
    build_course(tmp_path / "v1", 300, dim=DIM, nlist=4, nprobe=4, progress=False, recall=LOW)
    everything = Changes((), tuple(range(300)))
    update_version(tmp_path / "v1", tmp_path / "v2", Changes((), (0,)), lambda texts: None, random_vectors(DIM),
                   recall=LOW)
    assert (tmp_path / "v2" / "recall_queries.npz").is_file()
    update_version(tmp_path / "v1", tmp_path / "v2", everything, lambda texts: None, random_vectors(DIM),
                   force=True, recall=LOW)  # no document left: no recall measured, no queries
    assert not (tmp_path / "v2" / "recall_queries.npz").exists()
    assert load_version(tmp_path / "v2").recall_queries == {}
    assert verify_main(["verify", str(tmp_path / "v2")]) == 0
