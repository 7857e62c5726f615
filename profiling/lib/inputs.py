"""Realistic inputs for the in-process benchmarks: what each stage sees in service.

The reference client's queries, top-k id lists as search returns them, documents
from a documents.db or the support corpus, rerank requests of ten documents,
and answer-length texts for the classifiers. Seeded: runs are repeatable."""
from __future__ import annotations

import logging
import random
import sqlite3
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline import spec
from pipeline.spec import DOCUMENTS_TABLE as TABLE

log = logging.getLogger(__name__)

DOCS_PER_RERANK = spec.TOP_K  # the reranker sees what search and fetch return: 10 documents
DOC_POOL_SIZE = 400  # documents the rerank/generate inputs are drawn from
ANSWER_CHARS = (400, 512)  # classifier inputs: a full answer, up to the 512-character cut
SEED = 0


def cycled(items: Sequence, n: int, offset: int = 0) -> list:
    return [items[(offset + i) % len(items)] for i in range(n)]


def spec_queries(n: int, offset: int = 0) -> list[str]:
    """The reference client's eight queries, cycled: what the course client sends."""
    return cycled(spec.REFERENCE_QUERIES, n, offset)


def random_unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def max_doc_id(db_path: Path) -> int:
    # MAX over the primary key is one b-tree descent; COUNT(*) would scan 4.5M rows.
    with sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        value = conn.execute(f"SELECT MAX(doc_id) FROM {TABLE}").fetchone()[0]
    if value is None:
        raise ValueError(f"{db_path} holds no documents")
    return int(value)


def random_id_lists(n: int, max_id: int, seed: int) -> list[list[int]]:
    """n lists of top-k ids, as search returns them (uniform: the course index is random)."""
    rng = random.Random(seed)
    return [[rng.randint(0, max_id) for _ in range(spec.TOP_K)] for _ in range(n)]


def document_pool(documents_dir: Path | None, size: int = DOC_POOL_SIZE) -> list:
    """Documents to rerank and prompt with: from the given documents.db (what the
    service would fetch), else from the support corpus (varied, realistic lengths)."""
    if documents_dir is not None:
        from pipeline.docstore import DocumentStore
        with DocumentStore(documents_dir) as store:
            ids = [i for ids in random_id_lists((size + spec.TOP_K - 1) // spec.TOP_K, max_doc_id(store.path), SEED)
                   for i in ids]
            pool = [d for docs in store.fetch_batch([ids]) for d in docs]
        if pool:
            return pool
        log.warning("no documents found in %s; using the support corpus", documents_dir)
    from builders.corpus import support_documents
    return list(support_documents(size, seed=SEED))


def rerank_inputs(pool: Sequence, n: int, offset: int = 0) -> list:
    from pipeline.reranker import RerankRequest
    return [RerankRequest(query, tuple(cycled(pool, DOCS_PER_RERANK, (offset + i) * DOCS_PER_RERANK)))
            for i, query in enumerate(spec_queries(n, offset))]


def generation_prompts(generator, queries: Sequence[str], pool: Sequence) -> list:
    """The generator's prompt ids for each query with three documents of the pool as its context."""
    return [generator.prompt_ids(q, cycled(pool, spec.CONTEXT_DOCS, i * spec.CONTEXT_DOCS))
            for i, q in enumerate(queries)]


def answer_texts(pool: Sequence, n: int, offset: int = 0) -> list[str]:
    """Answers of 400-512 characters, the length the classifiers see at most.

    Built from support articles ("Answer: ..." as the LLM is told to reply) and
    cut at a word boundary to a seeded length, so batches are padded as in service."""
    rng = random.Random(SEED + offset)
    texts = []
    for i in range(n):
        limit = rng.randint(*ANSWER_CHARS)
        text, j = "Answer:", 0
        while len(text) <= limit:  # short articles: keep adding until the cut falls inside the text
            text += " " + pool[((offset + i) * 3 + j) % len(pool)].content
            j += 1
        texts.append(text[:limit].rsplit(" ", 1)[0])
    return texts


def query_set(n: int) -> list[str]:
    """n distinct questions: the reference client's eight, then support-article titles
    (short customer questions and topics), so a fidelity check is not eight queries repeated."""
    queries = list(dict.fromkeys(spec.REFERENCE_QUERIES))
    if n > len(queries):
        from builders.corpus import support_documents
        titles = dict.fromkeys(d.title for d in support_documents(max(DOC_POOL_SIZE, 4 * n), seed=SEED))
        queries += [t for t in titles if t not in queries]
    return cycled(queries, n)  # cycled only past the corpus's distinct titles
