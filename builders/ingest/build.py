"""Ingested documents written as a data version: a full build, or the next version of an earlier ingest.

Full build: every passage embedded, the IVF quantizer trained on them, files written as builders.data
writes them (builders.build_files: renamed into place, manifest last). Passages are numbered 0..n-1
in document order; that number is their row key and FAISS id.

Next version (``--from``): the previous ingest's documents are compared by content hash with what was
read; the passages of added and changed documents are embedded (numbered on from the previous
version's highest id, so an id never names two texts), those of changed and deleted documents
removed, through builders.incremental (the previous index's other vectors copied, never re-embedded).
The quantizer stays the one trained on the first build until the vectors added and removed since
then pass ``retrain_share`` of the vectors it was trained on, or the count has doubled: then the
version is built in full, trained again, and the result says why.
"""
from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from builders.build_files import BuildError, check_outputs, fsync_path, output_paths, staged_outputs, staged_queries
from builders.data import _ivf_params, _row_batches, _sample_rows, _train_index
from builders.incremental import Changes, update_version
from builders.ingest.documents import Passage, SourceDocument
from builders.ingest.embedding import DEFAULT_BATCH, IngestEmbedder, embed_sorted
from builders.ingest.splitter import SplitSettings, split_document
from builders.ivf_writer import write_ivfflat
from builders.manifest import index_parameters, version_of, write_build_manifest
from builders.recall import RecallOptions, measure_build
from pipeline.data_version import DataVersionError, Manifest, embedder_mismatch, load_version
from pipeline.docstore import Document
from pipeline.knowledge import (
    HEADING_SEPARATOR,
    KNOWLEDGE_SCHEMA,
    PASSAGE_COLUMNS,
    PASSAGES_TABLE,
    SOURCE_DOCUMENT_COLUMNS,
    SOURCE_DOCUMENTS_TABLE,
)
from pipeline.spec import DOCUMENTS_COLUMNS, DOCUMENTS_SCHEMA, DOCUMENTS_TABLE

KIND = "ingest"
DEFAULT_RETRAIN_SHARE = 0.5


@dataclass(frozen=True)
class BuildOptions:
    force: bool = False
    progress: bool = True
    shards: int = 1
    nlist: int | None = None
    nprobe: int = 64
    seed: int = 0
    batch_size: int = DEFAULT_BATCH
    retrain_share: float = DEFAULT_RETRAIN_SHARE
    recall: RecallOptions = RecallOptions()  # builders.recall: measured on every version, the floor enforced


@dataclass(frozen=True)
class IngestResult:
    manifest: Manifest
    documents: int
    passages: int
    embedded: int  # passages embedded by this run
    seconds: float
    added: int = 0  # documents, against --from's version
    changed: int = 0
    deleted: int = 0
    unchanged: int = 0
    retrained: str | None = None  # why a --from ingest was built in full, if it was
    split_seconds: float = 0.0
    embed_seconds: float = 0.0


@dataclass
class _Numbered:
    """Passages with their row ids, in id order."""
    ids: list[int] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)


def split_all(documents: Sequence[SourceDocument], embedder: IngestEmbedder, split: SplitSettings,
              first_id: int = 0) -> _Numbered:
    numbered = _Numbered()
    for document in documents:
        for passage in split_document(document, embedder.counter, split):
            numbered.ids.append(first_id + len(numbered.ids))
            numbered.passages.append(passage)
    return numbered


def full_build(out_dir: str | Path, documents: Sequence[SourceDocument], embedder: IngestEmbedder,
               split: SplitSettings, options: BuildOptions, record: dict[str, Any], *, parent: str | None = None,
               changes: dict[str, int] | None = None) -> IngestResult:
    """Every passage embedded and a quantizer trained on them (`parent` and `changes`: the version it
    follows when an ingest --from was built in full, for the manifest)."""
    started = time.perf_counter()
    version_of(out_dir, None)
    check_outputs(out_dir, options.force, options.shards)
    numbered = split_all(documents, embedder, split)
    split_done = time.perf_counter()
    n = len(numbered.passages)
    if n == 0:
        raise BuildError("no passages to ingest: every source was skipped or empty")
    params = _ivf_params(n, options.nlist, options.nprobe, None, options.batch_size, options.shards)
    vectors = embed_sorted([p.text for p in numbered.passages], [p.tokens for p in numbered.passages],
                           embedder.embed, embedder.identity.dim, options.batch_size, options.progress)
    embed_done = time.perf_counter()
    with staged_outputs(out_dir, options.force, options.shards) as (db_tmp, index_tmps):
        _write_database(db_tmp, documents, numbered)
        index = _train_index(vectors[_sample_rows(n, params.train_size, options.seed)], params)
        batches = partial(_row_batches, vectors, options.batch_size)
        write_ivfflat(index_tmps, index, batches, n, options.progress)
        recall = measure_build(index_tmps, batches, n, options.recall, options.seed, keep=staged_queries(out_dir))
    index_record = {**index_parameters(params, options.seed, embedder.identity.dim), "trained_vectors": n,
                    "changed_since_training": 0, "recall": recall.to_json()}
    record = {**record, "documents": len(documents), "passages": n, "embedded_passages": n}
    manifest = write_build_manifest(out_dir, kind=KIND, embedder=embedder.identity, documents=n, index=index_record,
                                    shards=options.shards, parent=parent, changes=changes, ingest=record)
    return IngestResult(manifest, len(documents), n, n, time.perf_counter() - started, added=len(documents),
                        split_seconds=split_done - started, embed_seconds=embed_done - split_done)


def next_version(from_dir: str | Path, out_dir: str | Path, documents: Sequence[SourceDocument],
                 embedder: IngestEmbedder, split: SplitSettings, options: BuildOptions,
                 record: dict[str, Any]) -> IngestResult:
    started = time.perf_counter()
    parent = _parent(from_dir, embedder)
    version_of(out_dir, None)
    check_outputs(out_dir, options.force, parent.shards)
    old_hashes, old_passages = _read_parent(from_dir)
    resplit = parent.ingest.get("split") != split.as_json()  # other passage settings: every passage anew
    new_ids = {document.id for document in documents}
    added = [d for d in documents if d.id not in old_hashes]
    changed = [d for d in documents if d.id in old_hashes and (resplit or old_hashes[d.id] != d.content_hash)]
    deleted = sorted(set(old_hashes) - new_ids)
    unchanged = len(documents) - len(added) - len(changed)
    gone = sorted(pid for doc_id in [*(d.id for d in changed), *deleted] for pid in old_passages.get(doc_id, ()))
    first_id = max((pid for pids in old_passages.values() for pid in pids), default=-1) + 1
    fresh = split_all([*added, *changed], embedder, split, first_id)
    split_done = time.perf_counter()
    total = parent.documents - len(gone) + len(fresh.passages)
    counts = dict(added=len(added), changed=len(changed), deleted=len(deleted), unchanged=unchanged)
    trained = int(parent.index.get("trained_vectors", parent.documents))
    since = int(parent.index.get("changed_since_training", 0)) + len(gone) + len(fresh.passages)
    why = _retrain_reason(since, trained, total, options.retrain_share, resplit)
    record = {**record, "documents": len(documents), "passages": total, **{f"documents_{k}": v for k, v in counts.items()}}
    if why is not None:
        options = dataclasses.replace(options, shards=parent.shards)
        result = full_build(out_dir, documents, embedder, split, options, {**record, "retrained": why},
                            parent=parent.version, changes={"added": len(fresh.passages), "deleted": len(gone)})
        return IngestResult(result.manifest, result.documents, result.passages, result.embedded,
                            time.perf_counter() - started, retrained=why, split_seconds=result.split_seconds,
                            embed_seconds=result.embed_seconds, **counts)
    if total == 0:
        raise BuildError("no passages left: every document of the previous version was deleted")
    vectors = embed_sorted([p.text for p in fresh.passages], [p.tokens for p in fresh.passages], embedder.embed,
                           embedder.identity.dim, options.batch_size, options.progress)
    embed_done = time.perf_counter()
    upserts = tuple(Document(pid, p.document.title, p.text, p.document.format)
                    for pid, p in zip(fresh.ids, fresh.passages))
    rewritten = [*(d.id for d in changed), *deleted]
    more_sql = partial(_apply_to_knowledge, rewritten=rewritten, gone=gone, documents=[*added, *changed],
                       numbered=fresh)
    record = {**record, "embedded_passages": len(fresh.passages)}
    update = update_version(from_dir, out_dir, Changes(upserts, tuple(gone)), embedder.embed, embedder.identity,
                            force=options.force, vectors=vectors, more_sql=more_sql,
                            index={**parent.index, "changed_since_training": since}, ingest=record,
                            recall=options.recall)
    return IngestResult(update.manifest, len(documents), total, len(fresh.passages), time.perf_counter() - started,
                        split_seconds=split_done - started, embed_seconds=embed_done - split_done, **counts)


def _retrain_reason(since: int, trained: int, total: int, share: float, resplit: bool) -> str | None:
    if resplit:
        return "the passage settings differ from the previous version's"
    if since > share * trained:
        return (f"{since} vectors added or removed since the quantizer was trained on {trained}: "
                f"more than --retrain-share {share:g}")
    if total >= 2 * trained:
        return f"{total} vectors, at least twice the {trained} the quantizer was trained on"
    return None


def _parent(from_dir: str | Path, embedder: IngestEmbedder) -> Manifest:
    try:
        parent = load_version(from_dir)
    except DataVersionError as exc:
        raise BuildError(f"--from: {exc}") from None
    if parent.kind != KIND:
        raise BuildError(f"--from {from_dir}: version {parent.version!r} is a {parent.kind!r} build, not an ingest "
                         "(build the first version of your documents without --from)")
    differences = embedder_mismatch(parent.embedder, embedder.identity)
    if differences:
        raise BuildError(f"--from: version {parent.version!r} was embedded by {parent.embedder.describe()}, this "
                         f"ingest embeds with {embedder.identity.describe()} ({'; '.join(differences)}): "
                         "ingest in full without --from")
    return parent


def _read_parent(from_dir: str | Path) -> tuple[dict[str, str], dict[str, list[int]]]:
    """The previous version's content hash of each document, and its passages' ids by document."""
    db_path, _ = output_paths(from_dir)
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        hashes = dict(conn.execute(f"SELECT id, content_hash FROM {SOURCE_DOCUMENTS_TABLE}").fetchall())
        passages: dict[str, list[int]] = {}
        for pid, doc_id in conn.execute(f"SELECT doc_id, document_id FROM {PASSAGES_TABLE} ORDER BY doc_id"):
            passages.setdefault(doc_id, []).append(pid)
    except sqlite3.DatabaseError as exc:
        raise BuildError(f"--from {from_dir}: its documents.db has no ingest tables ({exc})") from None
    finally:
        conn.close()
    return hashes, passages


def _document_rows(documents: Sequence[SourceDocument], numbered: _Numbered) -> list[tuple]:
    counts: dict[str, int] = {}
    for passage in numbered.passages:
        counts[passage.document.id] = counts.get(passage.document.id, 0) + 1
    return [(d.id, d.title, d.url, d.content_hash, d.format, counts.get(d.id, 0)) for d in documents]


def _passage_rows(numbered: _Numbered) -> list[tuple]:
    return [(pid, p.document.id, HEADING_SEPARATOR.join(p.headings), p.char_start, p.char_end, p.tokens)
            for pid, p in zip(numbered.ids, numbered.passages)]


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _write_database(path: Path, documents: Sequence[SourceDocument], numbered: _Numbered) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=OFF")  # a failed build deletes the file anyway
        conn.execute("PRAGMA synchronous=OFF")
        for statement in (DOCUMENTS_SCHEMA, *KNOWLEDGE_SCHEMA):
            conn.execute(statement)
        conn.execute("BEGIN")
        conn.executemany(_insert(DOCUMENTS_TABLE, DOCUMENTS_COLUMNS),
                         [(pid, p.document.title, p.text, p.document.format)
                          for pid, p in zip(numbered.ids, numbered.passages)])
        _insert_knowledge(conn, documents, numbered)
        conn.execute("COMMIT")
    finally:
        conn.close()
    fsync_path(path)


def _insert_knowledge(conn: sqlite3.Connection, documents: Sequence[SourceDocument], numbered: _Numbered) -> None:
    conn.executemany(_insert(SOURCE_DOCUMENTS_TABLE, SOURCE_DOCUMENT_COLUMNS), _document_rows(documents, numbered))
    conn.executemany(_insert(PASSAGES_TABLE, PASSAGE_COLUMNS), _passage_rows(numbered))


def _apply_to_knowledge(conn: sqlite3.Connection, *, rewritten: list[str], gone: list[int],
                        documents: list[SourceDocument], numbered: _Numbered) -> None:
    """The next version's ingest tables, in the transaction that changes its documents table."""
    conn.executemany(f"DELETE FROM {SOURCE_DOCUMENTS_TABLE} WHERE id = ?", [(i,) for i in rewritten])
    conn.executemany(f"DELETE FROM {PASSAGES_TABLE} WHERE doc_id = ?", [(i,) for i in gone])
    _insert_knowledge(conn, documents, numbered)
