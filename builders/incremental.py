"""Version N+1 from version N: documents added, replaced or deleted by doc_id, only those embedded.

    python -m builders.data update --from DATA/v1 --out DATA/v2 --changes changes.jsonl

``changes.jsonl`` holds one JSON object a line: a document (``doc_id``, ``title``, ``content``,
``category``) is added, or replaces the one with its doc_id; ``{"doc_id": N, "delete": true}``
deletes one. The new version copies N's database and applies them in one transaction; each index
shard is N's (the same trained quantizer, nlist and nprobe) with the changed and deleted ids removed
and the new vectors added, so the rest are never embedded again. Peak memory: one shard's index in
RAM. Files are written as a full build's (builders.build_files: renamed into place, manifest last),
and N is only read: it keeps serving meanwhile.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from builders.build_files import INSERT, BuildError, fsync_path, output_paths, staged_outputs, staged_queries
from builders.manifest import version_of, write_build_manifest
from builders.recall import RecallOptions, measure_build, stored_batches
from pipeline.data_version import DataVersionError, EmbedderInfo, Manifest, embedder_mismatch, load_version
from pipeline.docstore import Document
from pipeline.shards import document_shard
from pipeline.spec import DOCUMENTS_COLUMNS, DOCUMENTS_TABLE

log = logging.getLogger(__name__)

EmbedFn = Callable[[list[str]], np.ndarray]
EMBED_BATCH = 256


class InvalidChanges(BuildError, ValueError):
    pass


@dataclass(frozen=True)
class Changes:
    """Documents to add or replace (by doc_id) and doc_ids to delete; no id in both."""
    upserts: tuple[Document, ...]
    deletes: tuple[int, ...]

    @classmethod
    def read(cls, path: str | Path) -> Changes:
        """Parse a changes file; InvalidChanges naming the line and the rule."""
        upserts: dict[int, Document] = {}
        deletes: set[int] = set()
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise InvalidChanges(f"--changes {path}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise InvalidChanges(f"{where} is not JSON: {exc}") from None
            doc_id = entry.get("doc_id") if isinstance(entry, dict) else None
            if type(doc_id) is not int or doc_id < 0:
                raise InvalidChanges(f"{where}: 'doc_id' must be an integer >= 0")
            if doc_id in upserts or doc_id in deletes:
                raise InvalidChanges(f"{where}: doc_id {doc_id} is changed twice")
            if entry.get("delete") is True:
                deletes.add(doc_id)
                continue
            fields = [entry.get(column) for column in DOCUMENTS_COLUMNS[1:]]
            if not all(isinstance(value, str) and value for value in fields):
                raise InvalidChanges(f"{where}: a document needs non-empty strings "
                                     f"{', '.join(DOCUMENTS_COLUMNS[1:])} (or \"delete\": true)")
            upserts[doc_id] = Document(doc_id, *fields)
        return cls(tuple(upserts.values()), tuple(sorted(deletes)))


@dataclass(frozen=True)
class UpdateResult:
    manifest: Manifest
    added: int
    replaced: int
    deleted: int
    seconds: float


def update_version(from_dir: str | Path, out_dir: str | Path, changes: Changes, embed_fn: EmbedFn,
                   embedder: EmbedderInfo, *, force: bool = False, vectors: np.ndarray | None = None,
                   more_sql: Callable[[sqlite3.Connection], None] | None = None, index: dict | None = None,
                   ingest: dict | None = None, recall: RecallOptions | None = None) -> UpdateResult:
    """Build version `out_dir` from the complete version `from_dir` with `changes`, embedding only the
    upserted documents with `embed_fn` (which `embedder` names: it must be the one that built `from_dir`).

    For builders.ingest: `vectors` are the upserts' embeddings when already computed (then `embed_fn` is
    not called); `more_sql(connection)` runs in the documents' transaction (its other tables); `index` and
    `ingest` replace the parent's manifest entries. The new version's recall is measured as a build's
    (builders.recall, `recall`'s floor) at the parent's serving parameters, against its files' own vectors;
    its queries are kept with it, as a build's (builders.recall_queries)."""
    started = time.perf_counter()
    try:
        parent = load_version(from_dir)
    except DataVersionError as exc:
        raise BuildError(f"--from: {exc}") from None
    if parent.sharding:  # its shards own IVF lists, not doc_id % N
        raise BuildError(f"version {parent.version!r} is in {parent.shards} {parent.sharding.get('kind')} shards; an "
                         "update writes doc_id % N shards: build the new version in full (--sharding centroid)")
    version_of(out_dir, None)
    differences = embedder_mismatch(parent.embedder, embedder)
    if differences:
        raise BuildError(f"version {parent.version!r} was built by {parent.embedder.describe()}; this build's "
                         f"embedder is {embedder.describe()} ({'; '.join(differences)}): new vectors would not "
                         "match the old ones; build the new version in full instead")
    if parent.index.get("kind", "IVF-Flat") != "IVF-Flat":
        raise BuildError(f"version {parent.version!r} is a {parent.index.get('spec')} index: an update copies "
                         "IVF-Flat lists only; build the new version in full")
    old_db, old_index = output_paths(from_dir)
    existing = _existing_ids(old_db, [doc.doc_id for doc in changes.upserts] + list(changes.deletes))
    missing = sorted(set(changes.deletes) - existing)
    if missing:
        raise InvalidChanges(f"doc_ids to delete are not in version {parent.version!r}: {missing[:10]}")
    replaced = sum(doc.doc_id in existing for doc in changes.upserts)
    if vectors is None:
        vectors = _embed([doc.content for doc in changes.upserts], embed_fn, parent.embedder.dim)
    elif vectors.shape != (len(changes.upserts), parent.embedder.dim):
        raise ValueError(f"{vectors.shape} vectors given for {len(changes.upserts)} documents of dimension "
                         f"{parent.embedder.dim}")
    with staged_outputs(out_dir, force, parent.shards) as (db_tmp, index_tmps):
        documents = _write_documents(old_db, db_tmp, changes, more_sql)
        for shard, index_tmp in enumerate(index_tmps):
            _write_shard(Path(from_dir) / parent.index_files[shard], index_tmp, shard, parent.shards, changes,
                         vectors)
        stored, ids = stored_batches(index_tmps)
        report = measure_build(index_tmps, stored, len(ids), recall or RecallOptions(), ids_of=_slicer(ids),
                               nprobe=parent.index.get("nprobe"), keep=staged_queries(out_dir))
    delta = {"added": len(changes.upserts) - replaced, "replaced": replaced, "deleted": len(changes.deletes)}
    recorded = {**(parent.index if index is None else index), "recall": report.to_json()}
    manifest = write_build_manifest(out_dir, kind=parent.kind, embedder=parent.embedder, documents=documents,
                                    index=recorded, shards=parent.shards,
                                    parent=parent.version, changes=delta, ingest=ingest)
    return UpdateResult(manifest, delta["added"], replaced, delta["deleted"], time.perf_counter() - started)


def _slicer(ids: np.ndarray) -> Callable[[int, int], np.ndarray]:
    return lambda start, count: ids[start : start + count]


def run_update(args) -> str:
    """`python -m builders.data update`: the changes read and checked before the embedder loads."""
    from builders.build_files import check_outputs
    from builders.manifest import configured_embedder_fn
    from builders.recall import recall_options
    changes = Changes.read(args.changes)
    version_of(args.out, None)
    check_outputs(args.out, args.force)
    _refuse_ingested(args.source)
    embed_fn, identity = configured_embedder_fn()
    result = update_version(args.source, args.out, changes, embed_fn, identity, force=args.force,
                            recall=recall_options(args))
    m = result.manifest
    return (f"built version {m.version} from {m.parent}: {result.added} added, {result.replaced} replaced, "
            f"{result.deleted} deleted, {m.documents} documents, recall@10 {m.index['recall']['overall']}, "
            f"in {result.seconds:.1f} s\n  {args.out}")


def _refuse_ingested(from_dir: str | Path) -> None:
    """An ingested version's rows are passages with their sources' tables: changes by doc_id would
    leave those behind, so its next version comes from `builders.ingest --from` instead."""
    try:
        kind = load_version(from_dir).kind
    except DataVersionError:
        return  # update_version says what is wrong with it
    if kind == "ingest":
        raise BuildError(f"--from {from_dir} is a version of ingested documents: build its next version with "
                         f"python -m builders.ingest SOURCE... --from {from_dir} --out DIR")


def _existing_ids(db_path: Path, ids: Iterable[int]) -> set[int]:
    ids = list(ids)
    found: set[int] = set()
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(row[0] for row in conn.execute(
                f"SELECT doc_id FROM {DOCUMENTS_TABLE} WHERE doc_id IN ({marks})", chunk))
    finally:
        conn.close()
    return found


def _embed(texts: list[str], embed_fn: EmbedFn, dim: int) -> np.ndarray:
    parts = [np.asarray(embed_fn(texts[start : start + EMBED_BATCH]), dtype=np.float32)
             for start in range(0, len(texts), EMBED_BATCH)]
    vectors = np.concatenate(parts) if parts else np.empty((0, dim), dtype=np.float32)
    if vectors.shape != (len(texts), dim) or not np.isfinite(vectors).all():
        raise ValueError(f"embed_fn returned {vectors.shape} for {len(texts)} texts of dimension {dim}, "
                         "or non-finite values")
    return vectors


def _write_documents(old_db: Path, db_tmp: Path, changes: Changes,
                     more_sql: Callable[[sqlite3.Connection], None] | None = None) -> int:
    """N's database copied (SQLite's backup: a consistent snapshot) with the changes applied; its row count."""
    source = sqlite3.connect(f"{old_db.resolve().as_uri()}?mode=ro", uri=True)
    target = sqlite3.connect(db_tmp, isolation_level=None)
    try:
        source.backup(target)
        target.execute("BEGIN")
        target.executemany(f"DELETE FROM {DOCUMENTS_TABLE} WHERE doc_id = ?", [(i,) for i in changes.deletes])
        target.executemany(INSERT.replace("INSERT", "INSERT OR REPLACE", 1),
                           [doc.as_row() for doc in changes.upserts])
        if more_sql is not None:
            more_sql(target)
        target.execute("COMMIT")
        count = target.execute(f"SELECT COUNT(*) FROM {DOCUMENTS_TABLE}").fetchone()[0]
    finally:
        target.close()
        source.close()
    fsync_path(db_tmp)
    return int(count)


def _write_shard(old_path: Path, new_path: Path, shard: int, shards: int, changes: Changes,
                 vectors: np.ndarray) -> None:
    """One shard of N, its changed and deleted ids removed and its share of the new vectors added."""
    index = faiss.read_index(os.fspath(old_path))
    gone = np.array([i for i in [*changes.deletes, *(doc.doc_id for doc in changes.upserts)]
                     if document_shard(i, shards) == shard], dtype=np.int64)
    if len(gone):
        index.remove_ids(gone)
    rows = [row for row, doc in enumerate(changes.upserts) if document_shard(doc.doc_id, shards) == shard]
    if rows:
        ids = np.array([changes.upserts[row].doc_id for row in rows], dtype=np.int64)
        index.add_with_ids(np.ascontiguousarray(vectors[rows]), ids)
    faiss.write_index(index, os.fspath(new_path))
    fsync_path(new_path)
    log.info("shard %d of %d: %d removed, %d added, %d vectors", shard, shards, len(gone), len(rows), index.ntotal)
