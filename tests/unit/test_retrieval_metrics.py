"""profiling/lib/retrieval.py on hand-made data: section-heading queries from a passages table, hit@1, hit@10
and MRR@10, the vectors of an IVFFlat file, and faiss.index_factory kinds searched under the passages' ids."""
from __future__ import annotations

import sqlite3

import faiss
import numpy as np
import pytest

from pipeline.knowledge import KNOWLEDGE_SCHEMA
from profiling.lib.retrieval import (
    Query,
    build_kind,
    evaluate,
    heading_query,
    index_search,
    ivf_vectors,
    kind_spec,
    score,
    section_queries,
)


def passages_db(path, rows):
    conn = sqlite3.connect(path)
    for statement in KNOWLEDGE_SCHEMA:
        conn.execute(statement)
    conn.executemany("INSERT INTO passages VALUES (?, ?, ?, 0, 1, 1)", rows)
    conn.commit()
    conn.close()
    return path


def test_a_query_is_the_last_heading_without_numbering_or_pilcrow():
    assert heading_query("bisect — Array bisection algorithm > 8.3.1. Searching Sorted Lists¶") == "Searching Sorted Lists"
    assert heading_query("heapq — Heap queue algorithm") == "heapq — Heap queue algorithm"


def test_each_section_named_alone_is_a_query_its_passages_the_relevant_ones(tmp_path):
    db = passages_db(tmp_path / "d.db", [
        (0, "a.html", "Alpha > Install"), (1, "a.html", "Alpha > Install"), (2, "a.html", "Alpha > Examples"),
        (3, "b.html", "Beta > Examples"), (4, "b.html", "Beta"), (5, "b.html", ""), (6, "c.html", "Gamma > 2. install"),
        (7, "c.html", "Gamma > Usage"), (8, "c.html", "Gamma > Usage")])
    queries = section_queries(db)
    # "Examples" names two sections and "Install"/"install" two more: no query can tell them apart
    assert [(q.text, set(q.relevant)) for q in queries] == [("Beta", {4}), ("Usage", {7, 8})]
    assert [q.section for q in queries] == ["b.html > Beta", "c.html > Gamma > Usage"]


def test_a_limit_spreads_the_queries_over_the_whole_list(tmp_path):
    db = passages_db(tmp_path / "d.db", [(i, f"p{i:02}.html", f"Page {i}") for i in range(20)])
    assert [q.text for q in section_queries(db, limit=4)] == ["Page 0", "Page 5", "Page 10", "Page 15"]


def test_hit_at_1_hit_at_10_and_mrr():
    queries = [Query("q", frozenset({7}), "s"), Query("r", frozenset({3, 4}), "t"), Query("s", frozenset({9}), "u")]
    ranked = [[7, 1, 2], [1, 2, 4, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 9]]  # first, third, past the tenth
    scores = score(ranked, queries)
    assert (scores.queries, scores.hit_at_1, scores.hit_at_10) == (3, 1 / 3, 2 / 3)
    assert scores.mrr_at_10 == pytest.approx((1 + 1 / 3 + 0) / 3)
    with pytest.raises(ValueError, match="2 rankings for 3 queries"):
        score(ranked[:2], queries)


def test_the_vectors_of_an_ivfflat_come_back_under_their_ids(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    ids = rng.permutation(1000)[:300].astype(np.int64)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(16), 16, 8)
    index.train(vectors)
    index.add_with_ids(vectors, ids)
    faiss.write_index(index, str(tmp_path / "i.bin"))
    got_ids, got = ivf_vectors(tmp_path / "i.bin")
    order = np.argsort(ids)
    assert np.array_equal(got_ids, ids[order]) and np.array_equal(got, vectors[order])


def test_kinds_search_under_the_passages_ids_and_exact_kinds_agree_with_brute_force():
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((600, 32)).astype(np.float32)
    ids = np.arange(600, dtype=np.int64) * 3 + 5
    queries = vectors[:40] + 0.05 * rng.standard_normal((40, 32)).astype(np.float32)
    exact = np.argsort(((queries[:, None, :] - vectors[None]) ** 2).sum(-1), axis=1)[:, :10]
    relevant = [Query(str(i), frozenset({int(ids[i])}), str(i)) for i in range(40)]
    assert kind_spec("OPQ{m},IVF{nlist},PQ{m},RFlat", 12, 32) == "OPQ4,IVF12,PQ4,RFlat"
    for spec in ("Flat", "IVF12,Flat", "HNSW32,Flat", "IVF12,SQ8", "OPQ4,IVF12,PQ4,RFlat"):
        search = index_search(build_kind(spec, ids, vectors, nprobe=12))  # nprobe = nlist: every list searched
        found = search(queries, 10)
        if "SQ8" not in spec and "PQ" not in spec:
            assert [row[:10] for row in found] == ids[exact].tolist(), spec
        assert evaluate(search, queries, relevant, batch=16).hit_at_1 == 1.0, spec  # each query's own vector first
