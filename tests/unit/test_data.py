"""Data builder: layout, determinism, crash safety, CLI; and the support corpus."""
from __future__ import annotations

import functools
import os
import re
import sqlite3
import zlib
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import pytest

from builders import build_files, data
from builders.build_files import OutputExistsError
from builders.corpus import CATEGORIES, course_document, support_documents
from builders.data import InvalidBuildArgument, build_course, build_support
from builders.recall import RecallOptions
from pipeline.shards import merge_arrays, shard_file_problems
from pipeline.vector_index import VectorIndex
from tests.helpers import leftovers

ROOT = Path(__file__).resolve().parents[2]
N_COURSE = 3000
FAKE_DIM = 64


STOPWORDS = set("the and for you your our can are with that this from have has not any how what when will yet".split())


@functools.cache
def word_vector(word: str) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(word.encode())).standard_normal(FAKE_DIM).astype(np.float32)


def fake_embed(texts: list[str]) -> np.ndarray:
    """Hashed bag of words: deterministic, and texts sharing words land close together."""
    out = np.zeros((len(texts), FAKE_DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z]{3,}", text.lower()):
            if word not in STOPWORDS:
                out[row] += word_vector(word)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def rows(db_path: Path) -> list[tuple]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT * FROM documents ORDER BY doc_id").fetchall()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return build_course(tmp_path_factory.mktemp("course"), N_COURSE, seed=0, progress=False, batch_size=1000)


# ---------------------------------------------------------------- course layout


def test_course_layout(course):
    assert course.db_path == course.index_path.parent / "documents" / "documents.db"
    assert (course.n_docs, course.ntotal, course.dim) == (N_COURSE, N_COURSE, 768)
    assert course.nlist == N_COURSE // 39 and course.nprobe == 64


def test_course_rows_and_schema(course):
    with sqlite3.connect(course.db_path) as conn:
        schema = conn.execute("PRAGMA table_info(documents)").fetchall()
        count = conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
        sample = conn.execute("SELECT * FROM documents WHERE doc_id IN (0, 1, 1234, 2999) ORDER BY doc_id").fetchall()
    assert [(name, type_, notnull, pk) for _, name, type_, notnull, _, pk in schema] == [
        ("doc_id", "INTEGER", 0, 1), ("title", "TEXT", 1, 0), ("content", "TEXT", 1, 0), ("category", "TEXT", 1, 0)]
    assert count == N_COURSE
    assert sample == [course_document(i).as_row() for i in (0, 1, 1234, 2999)]
    assert sample[2] == (1234, "Document 1234",
                         "This is the content of document 1234. It contains information about customer support issue 34.",
                         "shipping")


def test_course_index(course):
    index = faiss.read_index(str(course.index_path))
    ivf = faiss.extract_index_ivf(index)
    assert isinstance(index, faiss.IndexIVFFlat) and index.metric_type == faiss.METRIC_L2
    assert (index.ntotal, index.d, ivf.nlist, ivf.nprobe) == (N_COURSE, 768, course.nlist, 64)
    # Ids are row positions: each stored vector finds its own doc_id.
    vectors = next(data.course_vector_batches(N_COURSE, seed=0, batch_size=N_COURSE))
    probe = [0, 17, 1500, 2999]
    ids, distances = VectorIndex.load(course.index_path, nprobe=1).search(vectors[probe], 10)
    assert ids[:, 0].tolist() == probe and np.allclose(distances[:, 0], 0)


def test_streamed_index_is_byte_identical_to_faiss(course):
    params = data._ivf_params(N_COURSE, None, 64, None, 1000)
    index = data._train_index(next(data.course_vector_batches(params.train_size, seed=0, batch_size=params.train_size)), params)
    for batch in data.course_vector_batches(N_COURSE, seed=0, batch_size=1000):
        index.add(batch)
    assert faiss.serialize_index(index).tobytes() == course.index_path.read_bytes()


def test_sparse_list_table_matches_faiss(tmp_path):
    # More lists than half the vectors can fill: faiss switches to its sparse size table.
    result = build_course(tmp_path, 200, nlist=150, train_size=200, progress=False, batch_size=64)
    params = data._ivf_params(200, 150, 64, 200, 64)
    index = data._train_index(next(data.course_vector_batches(200, seed=0, batch_size=200)), params)
    for batch in data.course_vector_batches(200, seed=0, batch_size=64):
        index.add(batch)
    assert faiss.serialize_index(index).tobytes() == result.index_path.read_bytes()


# ---------------------------------------------------------------- determinism


def test_same_seed_is_byte_identical(course, tmp_path):
    again = build_course(tmp_path, N_COURSE, seed=0, progress=False, batch_size=700)  # batch size is irrelevant
    assert again.index_path.read_bytes() == course.index_path.read_bytes()
    assert rows(again.db_path) == rows(course.db_path)


def test_different_seed_differs(course, tmp_path):
    other = build_course(tmp_path, N_COURSE, seed=1, progress=False)
    assert other.index_path.read_bytes() != course.index_path.read_bytes()
    assert other.index_path.stat().st_size == course.index_path.stat().st_size


def test_small_corpus_scales_nlist_and_nprobe(tmp_path):
    result = build_course(tmp_path, 100, progress=False)
    assert (result.nlist, result.nprobe) == (2, 2)
    assert VectorIndex.load(result.index_path, nprobe=None).nprobe == 2
    assert [data.default_nlist(n) for n in (1, 38, 39, 1000, 4_500_000)] == [1, 1, 1, 25, 4096]


def test_invalid_arguments(tmp_path):
    for kwargs in ({"n_docs": 0}, {"n_docs": 10, "nlist": 11}, {"n_docs": 10, "nprobe": 0}):
        with pytest.raises(InvalidBuildArgument):
            build_course(tmp_path, progress=False, **kwargs)
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- overwrite and crash safety


def test_refuses_to_overwrite_without_force(tmp_path):
    first = build_course(tmp_path, 300, progress=False)
    before = (first.index_path.read_bytes(), first.db_path.read_bytes())
    with pytest.raises(OutputExistsError, match="--force"):
        build_course(tmp_path, 300, seed=5, progress=False)
    assert (first.index_path.read_bytes(), first.db_path.read_bytes()) == before
    forced = build_course(tmp_path, 300, seed=5, force=True, progress=False)
    assert forced.index_path.read_bytes() != before[0]
    assert sorted(p.name for p in leftovers(tmp_path)) == ["documents.db", "faiss_index.bin", "manifest.json", "recall_queries.npz"]


def failing_vectors(fail_on_call: int, exc: BaseException):
    """A course_vector_batches that raises after one batch of its n-th call.

    Call 1 draws the training sample, call 2 is the assignment pass, call 3 the write pass.
    """
    real = data.course_vector_batches
    calls = []

    def batches(*args, **kwargs):
        calls.append(1)
        for i, batch in enumerate(real(*args, **kwargs)):
            if len(calls) == fail_on_call and i == 1:
                raise exc
            yield batch

    return batches


@pytest.mark.parametrize("fail_on_call", [2, 3])
@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_interrupted_course_build_leaves_nothing(tmp_path, monkeypatch, fail_on_call, exc):
    monkeypatch.setattr(data, "course_vector_batches", failing_vectors(fail_on_call, exc))
    with pytest.raises(type(exc)):
        build_course(tmp_path, 1000, batch_size=200, progress=False)
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "documents").exists()


def test_interrupted_forced_rebuild_keeps_previous_build(tmp_path, monkeypatch):
    first = build_course(tmp_path, 500, progress=False)
    before = (first.index_path.read_bytes(), rows(first.db_path))
    monkeypatch.setattr(data, "course_vector_batches", failing_vectors(3, RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        build_course(tmp_path, 500, seed=9, force=True, batch_size=100, progress=False)
    assert (first.index_path.read_bytes(), rows(first.db_path)) == before
    assert sorted(p.name for p in leftovers(tmp_path)) == ["documents.db", "faiss_index.bin", "manifest.json", "recall_queries.npz"]


def test_failure_between_renames_removes_both(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "faiss_index.bin":
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(build_files.os, "replace", replace)
    with pytest.raises(OSError, match="disk gone"):
        build_course(tmp_path, 300, progress=False)
    assert leftovers(tmp_path) == []


def test_stale_partials_are_cleaned(tmp_path):
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / ".documents.db.partial").write_bytes(b"junk")
    (tmp_path / ".faiss_index.bin.partial").write_bytes(b"junk")
    build_course(tmp_path, 300, progress=False)
    assert sorted(p.name for p in leftovers(tmp_path)) == ["documents.db", "faiss_index.bin", "manifest.json", "recall_queries.npz"]


# ---------------------------------------------------------------- shards


N_SHARDED = 1200


def stored_ids(index: faiss.Index) -> np.ndarray:
    """Every id an IVF index file holds, list by list."""
    invlists = faiss.extract_index_ivf(index).invlists
    parts = [faiss.rev_swig_ptr(invlists.get_ids(lst), invlists.list_size(lst)).copy()
             for lst in range(invlists.nlist) if invlists.list_size(lst)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    # nprobe 4 of 30 lists: a stored search that is not exhaustive.
    # Its recall is under the floor, and is accepted: these tests compare shards with the unsharded index.
    low = RecallOptions(accept_low=True, queries=100)
    unsharded = build_course(out / "one", N_SHARDED, nprobe=4, seed=0, progress=False, batch_size=250, recall=low)
    three = build_course(out / "three", N_SHARDED, nprobe=4, seed=0, progress=False, batch_size=250, shards=3,
                         recall=low)
    return unsharded, three


def test_sharded_build_layout(sharded):
    unsharded, three = sharded
    assert sorted(p.name for p in leftovers(three.index_path.parent)) == [
        "documents.db", "faiss_index.shard-0-of-3.bin", "faiss_index.shard-1-of-3.bin", "faiss_index.shard-2-of-3.bin",
        "manifest.json", "recall_queries.npz"]
    assert not three.index_path.exists() and three.shards == 3 and len(three.index_files) == 3
    assert rows(three.db_path) == rows(unsharded.db_path)
    assert three.index_bytes > 0 and "3 shards" in data._describe(three)


def test_shards_hold_disjoint_ids_covering_all_with_the_unsharded_parameters(sharded):
    unsharded, three = sharded
    whole = faiss.read_index(str(unsharded.index_path))
    seen = []
    for shard, path in enumerate(three.index_files):
        index = faiss.read_index(str(path))
        ivf = faiss.extract_index_ivf(index)
        ids = stored_ids(index)
        assert isinstance(index, faiss.IndexIVFFlat) and index.metric_type == faiss.METRIC_L2
        assert (ivf.nlist, ivf.nprobe, index.d) == (three.nlist, three.nprobe, 768)
        assert index.ntotal == len(ids) == len(range(shard, N_SHARDED, 3))
        assert set(ids.tolist()) == set(range(shard, N_SHARDED, 3))  # document_shard(id) == shard
        # The unsharded build's centroids, in every shard.
        assert np.array_equal(ivf.quantizer.reconstruct_n(0, ivf.nlist),
                              faiss.extract_index_ivf(whole).quantizer.reconstruct_n(0, ivf.nlist))
        seen.append(ids)
    assert sorted(np.concatenate(seen).tolist()) == list(range(N_SHARDED))


def test_shard_files_are_byte_identical_to_faiss_add_with_ids(sharded):
    _, three = sharded
    params = data._ivf_params(N_SHARDED, None, 4, None, 250)
    trained = data._train_index(next(data.course_vector_batches(params.train_size, seed=0, batch_size=params.train_size)),
                                params)
    vectors = next(data.course_vector_batches(N_SHARDED, seed=0, batch_size=N_SHARDED))
    for shard, path in enumerate(three.index_files):
        expected = faiss.clone_index(trained)
        ids = np.arange(shard, N_SHARDED, 3, dtype=np.int64)
        expected.add_with_ids(vectors[ids], ids)
        assert faiss.serialize_index(expected).tobytes() == path.read_bytes()


@pytest.mark.parametrize("nprobe", [None, "all"])
def test_merged_shard_searches_equal_unsharded(sharded, nprobe):
    # The stored nprobe (4 of 30 lists), and every list: an exact (flat) search, checked against IndexFlatL2 too.
    unsharded, three = sharded
    probe = three.nlist if nprobe == "all" else None
    queries = np.random.default_rng(7).random((30, 768), dtype=np.float32)
    expected_ids, expected_distances = VectorIndex.load(unsharded.index_path, nprobe=probe).search(queries, 10)
    per_shard = [VectorIndex.load(path, nprobe=probe).search(queries, 10) for path in three.index_files]
    merged_ids, merged_distances = merge_arrays(per_shard, 10)
    assert np.array_equal(merged_ids, expected_ids) and np.array_equal(merged_distances, expected_distances)
    if nprobe == "all":
        flat = faiss.IndexFlatL2(768)
        flat.add(next(data.course_vector_batches(N_SHARDED, seed=0, batch_size=N_SHARDED)))
        flat_distances, flat_ids = flat.search(queries, 10)
        assert np.array_equal(merged_ids, flat_ids) and np.allclose(merged_distances, flat_distances, rtol=1e-5)


def test_sharded_support_build(tmp_path):
    result = build_support(tmp_path, 300, fake_embed, progress=False, batch_size=64, shards=2)
    contents = [r[2] for r in rows(result.db_path)[:6]]
    per_shard = [VectorIndex.load(path, nprobe=None).search(fake_embed(contents), 1) for path in result.index_files]
    assert merge_arrays(per_shard, 1)[0][:, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_rebuild_with_another_shard_count_needs_force_and_removes_the_old_files(tmp_path):
    first = build_course(tmp_path, 200, progress=False)
    with pytest.raises(OutputExistsError, match="faiss_index.bin"):
        build_course(tmp_path, 200, progress=False, shards=2)
    two = build_course(tmp_path, 200, progress=False, shards=2, force=True)
    assert not first.index_path.exists() and all(p.is_file() for p in two.index_files)
    assert shard_file_problems(two.index_path, 2) == []
    build_course(tmp_path, 200, progress=False, shards=4, force=True)
    assert shard_file_problems(two.index_path, 4) == []
    assert sorted(p.name for p in leftovers(tmp_path) if "shard" in p.name) == [
        f"faiss_index.shard-{k}-of-4.bin" for k in range(4)]
    build_course(tmp_path, 200, progress=False, force=True)
    assert sorted(p.name for p in leftovers(tmp_path)) == ["documents.db", "faiss_index.bin", "manifest.json", "recall_queries.npz"]


def test_interrupted_sharded_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "course_vector_batches", failing_vectors(3, RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        build_course(tmp_path, 600, batch_size=100, progress=False, shards=3)
    assert leftovers(tmp_path) == []


def test_failure_between_shard_renames_removes_every_file(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "faiss_index.shard-1-of-2.bin":
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(build_files.os, "replace", replace)
    with pytest.raises(OSError, match="disk gone"):
        build_course(tmp_path, 300, progress=False, shards=2)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("shards", [0, -1, 11])
def test_invalid_shard_counts(tmp_path, shards):
    with pytest.raises(InvalidBuildArgument, match="--shards"):
        build_course(tmp_path, 10, progress=False, shards=shards)
    assert leftovers(tmp_path) == []


def test_cli_shards(tmp_path, capsys):
    assert data.main(["build", "--out", str(tmp_path), "--docs", "120", "--shards", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "2 shards" in out and "faiss_index.shard-0-of-2.bin" in out and "faiss_index.shard-1-of-2.bin" in out
    assert data.main(["build", "--out", str(tmp_path), "--docs", "120", "--shards", "0", "--no-progress"]) == 2


# ---------------------------------------------------------------- support build


@pytest.fixture(scope="module")
def support(tmp_path_factory):
    return build_support(tmp_path_factory.mktemp("support"), 2000, fake_embed, seed=0, progress=False, batch_size=128)


def test_support_build(support):
    assert (support.n_docs, support.ntotal, support.dim, support.nlist) == (2000, 2000, FAKE_DIM, 2000 // 39)
    db_rows = rows(support.db_path)
    assert db_rows == [doc.as_row() for doc in support_documents(2000, seed=0)]
    index = VectorIndex.load(support.index_path, nprobe=None)
    assert (index.ntotal, index.dim, index.nprobe) == (2000, FAKE_DIM, support.nprobe)
    contents = [r[2] for r in db_rows[:5]]
    assert index.search(fake_embed(contents), 1)[0][:, 0].tolist() == [0, 1, 2, 3, 4]


REFERENCE_QUERIES = {
    "How do I return a defective product?": "defective",
    "What is your refund policy?": "refund",
    "My order hasn't arrived yet, tracking number is ABC123": "arrived|late|delivered|track",
    "How do I update my billing information?": "billing",
    "Is there a warranty on electronic items?": "warranty",
    "Can I change my shipping address after placing an order?": "address",
    "What payment methods do you accept?": "payment|pay",
    "How long does shipping typically take?": "shipping|delivery",
}


def test_support_covers_reference_queries(support):
    index = VectorIndex.load(support.index_path)
    ids, _ = index.search(fake_embed(list(REFERENCE_QUERIES)), 10)
    titles = {r[0]: r[1] for r in rows(support.db_path)}
    for (query, pattern), hits in zip(REFERENCE_QUERIES.items(), ids):
        top = [titles[i] for i in hits[:5]]
        assert any(re.search(pattern, t, re.I) for t in top), (query, top)


def test_support_embedding_failure_leaves_nothing(tmp_path):
    calls = []

    def flaky(texts):
        calls.append(len(texts))
        if len(calls) == 3:
            raise RuntimeError("model crashed")
        return fake_embed(texts)

    with pytest.raises(RuntimeError, match="model crashed"):
        build_support(tmp_path, 500, flaky, batch_size=100, progress=False)
    assert leftovers(tmp_path) == []


def test_support_rejects_bad_embeddings(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        build_support(tmp_path, 100, lambda texts: fake_embed(texts)[:-1], progress=False)
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- corpus


def test_support_corpus_is_distinct_balanced_and_realistic():
    docs = list(support_documents(12_000, seed=0))
    assert [d.doc_id for d in docs] == list(range(12_000))
    assert len({d.content for d in docs}) == len(docs)
    assert Counter(d.category for d in docs) == {c: 3000 for c in CATEGORIES}
    lengths = [len(d.content) for d in docs]
    assert 300 <= min(lengths) and max(lengths) <= 1200 and 450 <= np.mean(lengths) <= 800
    assert all(d.title and not d.title[0].islower() and "{" not in d.title + d.content for d in docs)


def test_support_corpus_is_seeded_and_prefix_stable():
    assert list(support_documents(50, seed=3)) == list(support_documents(200, seed=3))[:50]
    assert list(support_documents(50, seed=3)) != list(support_documents(50, seed=4))


def test_support_corpus_topics():
    text = " ".join(f"{d.title} {d.content}" for d in support_documents(2000)).lower()
    for phrase in ["defective", "refund policy", "hasn't arrived", "tracking number", "billing information",
                   "warranty", "shipping address", "payment methods", "business days", "gift card", "password",
                   "subscription", "privacy", "exchange", "promo code", "repair", "bluetooth", "lost"]:
        assert phrase in text, phrase
