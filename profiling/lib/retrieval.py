"""Retrieval quality on an ingested data version: queries from its section headings (the relevant passages
are the section's own), hit@1, hit@10 and MRR@10 of any search function, the version rebuilt as another
index kind by the project's own builder (:func:`kind_version`), and an exact faiss index of its vectors.

A section is one (document, heading path) of the ``passages`` table (pipeline/knowledge.py). Its query is
its last heading, numbering and pilcrows dropped; a heading that names more than one section ("Examples",
"Notes") is no query, since no search could tell which section it means."""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from pipeline.knowledge import HEADING_SEPARATOR

SearchFn = Callable[[np.ndarray, int], Sequence[Sequence[int]]]  # (queries, k) -> each query's ids, nearest first
TOP_K = 10
_NUMBERING = re.compile(r"^\d+(\.\d+)*\.?\s+")


@dataclass(frozen=True)
class Query:
    text: str
    relevant: frozenset[int]  # the section's passage ids
    section: str  # "document > heading path"


@dataclass(frozen=True)
class Scores:
    queries: int
    hit_at_1: float
    hit_at_10: float
    mrr_at_10: float

    def as_json(self) -> dict:
        return {"queries": self.queries, "hit@1": self.hit_at_1, "hit@10": self.hit_at_10, "mrr@10": self.mrr_at_10}


def heading_query(heading_path: str) -> str:
    """A section's query: its own (last) heading, without numbering or the pilcrow Sphinx appends."""
    last = heading_path.split(HEADING_SEPARATOR)[-1].replace("¶", " ")
    return _NUMBERING.sub("", " ".join(last.split()))


def section_queries(db_path: str | Path, limit: int | None = None) -> list[Query]:
    """One query per section whose heading names it alone, in (document, heading) order; `limit` takes
    that many spread evenly over the list."""
    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT doc_id, document_id, heading FROM passages ORDER BY doc_id").fetchall()
    finally:
        conn.close()
    sections: dict[tuple[str, str], set[int]] = {}
    for passage, document, heading in rows:
        if heading.strip():
            sections.setdefault((document, heading), set()).add(int(passage))
    named: dict[str, int] = {}
    for _, heading in sections:
        key = heading_query(heading).casefold()
        named[key] = named.get(key, 0) + 1
    queries = [Query(heading_query(heading), frozenset(ids), f"{document}{HEADING_SEPARATOR}{heading}")
               for (document, heading), ids in sorted(sections.items())
               if heading_query(heading) and named[heading_query(heading).casefold()] == 1]
    if limit is not None and limit < len(queries):
        queries = [queries[i * len(queries) // limit] for i in range(limit)]
    return queries


def score(ranked: Sequence[Sequence[int]], queries: Sequence[Query], k: int = TOP_K) -> Scores:
    """hit@1, hit@k (a relevant passage first, or among the first k) and MRR@k (1/rank of the first
    relevant one in the first k, 0 if none), averaged over the queries."""
    if len(ranked) != len(queries) or not queries:
        raise ValueError(f"{len(ranked)} rankings for {len(queries)} queries")
    reciprocal = []
    for ids, query in zip(ranked, queries):
        rank = next((i + 1 for i, pid in enumerate(list(ids)[:k]) if int(pid) in query.relevant), None)
        reciprocal.append(1.0 / rank if rank else 0.0)
    found = np.asarray(reciprocal)
    return Scores(len(queries), float((found == 1.0).mean()), float((found > 0).mean()), float(found.mean()))


def evaluate(search: SearchFn, query_vectors: np.ndarray, queries: Sequence[Query], *, batch: int = 16,
             k: int = TOP_K) -> Scores:
    """`search` asked in batches of `batch` queries (a worker's search batch), scored against `queries`."""
    ranked: list[Sequence[int]] = []
    for start in range(0, len(queries), batch):
        ranked.extend(search(np.ascontiguousarray(query_vectors[start : start + batch], dtype=np.float32), k))
    return score(ranked, queries, k)


def ivf_vectors(index_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of an IndexIVFFlat file, read from its inverted lists as stored."""
    index = faiss.read_index(str(index_path))
    ids, rows = [], []
    for lst in range(index.nlist):
        size = index.invlists.list_size(lst)
        if size:
            ids.append(faiss.rev_swig_ptr(index.invlists.get_ids(lst), size).copy())
            codes = faiss.rev_swig_ptr(index.invlists.get_codes(lst), size * index.code_size).copy()
            rows.append(codes.view(np.float32).reshape(size, index.d))
    order = np.argsort(np.concatenate(ids))
    return np.concatenate(ids)[order].astype(np.int64), np.ascontiguousarray(np.concatenate(rows)[order])


def kind_version(source: Path, out: Path, spec: str, *, nprobe: int, seed: int = 0, batch: int = 1024):
    """The ingested version in `source` rebuilt as index kind `spec` (``--index``, builders/index_kinds.py) into
    the version `out`: the same documents (linked), the vectors read back from its IVF-Flat index and written
    by builders.data's own writer (its recall measured, its manifest last), so an index node serves it as any
    build. The writer numbers vectors by row; returns the manifest and the ids of the rows, in order."""
    from functools import partial

    from builders.build_files import output_paths
    from builders.data import write_index
    from builders.index_kinds import ivf_params, parse_index_spec, row_batches, sample_rows
    from builders.manifest import index_parameters, write_build_manifest
    from builders.recall import RecallOptions
    from pipeline.data_version import load_version
    parent = load_version(source)
    (source_db, source_index), (db, index_path) = output_paths(source), output_paths(out)
    ids, vectors = ivf_vectors(source_index)
    n, dim = vectors.shape
    params = ivf_params(n, int(parent.index["nlist"]), nprobe, None, batch, 1, parse_index_spec(spec, dim))
    shutil.rmtree(out, ignore_errors=True)
    db.parent.mkdir(parents=True)
    try:
        os.link(source_db, db)
    except OSError:  # another file system
        shutil.copyfile(source_db, db)
    record = write_index([index_path], spec, params, vectors[sample_rows(n, params.train_size, seed)],
                         partial(row_batches, vectors, batch), n, False, RecallOptions(accept_low=True), seed)
    manifest = write_build_manifest(out, kind=parent.kind, embedder=parent.embedder, documents=parent.documents,
                                    index=index_parameters(params, seed, dim, record), shards=1, ingest=parent.ingest)
    return manifest, ids


def kind_spec(kind: str, nlist: int, dim: int) -> str:
    """A faiss index_factory string with {nlist} (the served index's) and {m} (dim / 8 sub-quantizers) filled."""
    return kind.format(nlist=nlist, m=max(1, dim // 8))


def build_kind(spec: str, ids: np.ndarray, vectors: np.ndarray, *, nprobe: int, ef_search: int = 64,
               k_factor: int = 4) -> faiss.Index:
    """`spec` (faiss.index_factory, L2) trained and filled with `vectors` under their `ids`; searched with
    `nprobe` lists (IVF kinds), `ef_search` (HNSW) and `k_factor` x k candidates re-ranked exactly (RFlat)."""
    index = faiss.index_factory(vectors.shape[1], spec, faiss.METRIC_L2)
    if not index.is_trained:
        index.train(vectors)
    mapped = faiss.IndexIDMap(index)
    mapped.add_with_ids(vectors, ids)
    space = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search), ("k_factor_rf", k_factor)):
        try:
            space.set_index_parameter(mapped, name, value)
        except RuntimeError:  # a kind without that parameter
            pass
    return mapped


def index_search(index: faiss.Index) -> SearchFn:
    def search(vectors: np.ndarray, k: int) -> list[list[int]]:
        _, ids = index.search(vectors, k)
        return [[int(pid) for pid in row if pid >= 0] for row in ids]
    return search
