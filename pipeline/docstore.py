"""Read-only access to the SQLite document store (``documents.db``, the course's schema:
``pipeline.spec.DOCUMENTS_SCHEMA``); a whole batch of requests' search results in one SQL query. An
ingested store's rows are passages, each with its source (``pipeline.knowledge``) read in the same query."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.knowledge import PASSAGES_TABLE, SOURCE_DOCUMENTS_TABLE, SourceRef
from pipeline.spec import DOCUMENTS_COLUMNS, DOCUMENTS_DB, DOCUMENTS_TABLE


class DocumentStoreError(RuntimeError):
    """The database exists but is not a usable document store."""


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: int
    title: str
    content: str
    category: str
    source: SourceRef | None = None  # an ingested passage's document and headings; not a column of its row

    def as_row(self) -> tuple[int, str, str, str]:
        """The row in column order, as inserted into ``documents``."""
        return (self.doc_id, self.title, self.content, self.category)

    def __iter__(self) -> Iterator:
        # Lets a Document be unpacked like the (doc_id, title, content, category) tuple.
        return iter(self.as_row())

    def as_source(self) -> int | dict[str, Any]:
        """How a reply's ``sources`` names this row: an ingested passage by its document, title, heading
        and URL; a row of a course or support build by its doc_id alone."""
        return self.doc_id if self.source is None else self.source.as_source(self.doc_id)


class DocumentStore:
    """A read-only, thread-safe handle on ``documents.db``: one connection shared behind a lock, so a
    store created on one thread serves a worker thread; primary-key lookups cost little serialised."""

    def __init__(self, path: str | Path):
        self.path = _resolve_db_path(path)
        self._lock = threading.Lock()
        # mode=ro: the serving side must never create or modify the database.
        self._conn = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
        try:
            _check_schema(self._conn, self.path)
        except BaseException:
            self._conn.close()
            raise
        self._max_vars = self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.has_passages = _has_table(self._conn, PASSAGES_TABLE) and _has_table(self._conn, SOURCE_DOCUMENTS_TABLE)
        columns = ", ".join(f"d.{column}" for column in DOCUMENTS_COLUMNS)
        if self.has_passages:
            self._sql = (f"SELECT {columns}, p.document_id, s.title, p.heading, s.url FROM {DOCUMENTS_TABLE} d "
                         f"LEFT JOIN {PASSAGES_TABLE} p ON p.doc_id = d.doc_id "
                         f"LEFT JOIN {SOURCE_DOCUMENTS_TABLE} s ON s.id = p.document_id WHERE d.doc_id IN ")
        else:
            self._sql = f"SELECT {columns} FROM {DOCUMENTS_TABLE} d WHERE d.doc_id IN "

    def fetch_batch(self, id_lists: Sequence[Iterable[int]]) -> list[list[Document]]:
        """Documents for each id list, in the order of its ids, all in one ``SELECT`` (more only past
        SQLite's bound-variable limit). Negative (faiss's padding) and unknown ids are dropped; an id
        repeated inside one request is returned each time."""
        requests = [[int(i) for i in ids] for ids in id_lists]
        wanted = list(dict.fromkeys(i for ids in requests for i in ids if i >= 0))
        by_id = self._select(wanted)
        return [[by_id[i] for i in ids if i in by_id] for ids in requests]

    def fetch(self, ids: Iterable[int]) -> list[Document]:
        """Single-request convenience wrapper around :meth:`fetch_batch`."""
        return self.fetch_batch([ids])[0]

    def count(self) -> int:
        """Number of rows (a full table scan: for diagnostics, not hot paths)."""
        with self._lock:
            return self._conn.execute(f"SELECT COUNT(*) FROM {DOCUMENTS_TABLE}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> DocumentStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DocumentStore({str(self.path)!r})"

    def _select(self, ids: list[int]) -> dict[int, Document]:
        found: dict[int, Document] = {}
        with self._lock:
            for start in range(0, len(ids), self._max_vars):
                chunk = ids[start : start + self._max_vars]
                marks = ",".join("?" * len(chunk))
                for row in self._conn.execute(f"{self._sql}({marks})", chunk):
                    source = SourceRef(*row[4:]) if len(row) > 4 and row[4] is not None else None
                    found[row[0]] = Document(row[0], row[1], row[2], row[3], source)
        return found


def _resolve_db_path(path: str | Path) -> Path:
    # Accept DOCUMENTS_DIR as well as the file itself.
    path = Path(path)
    if path.is_dir():
        path = path / DOCUMENTS_DB
    if not path.is_file():
        raise FileNotFoundError(f"document database not found: {path}")
    return path.resolve()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _check_schema(conn: sqlite3.Connection, path: Path) -> None:
    try:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({DOCUMENTS_TABLE})")}
    except sqlite3.DatabaseError as exc:
        raise DocumentStoreError(f"{path} is not a readable SQLite database: {exc}") from exc
    if not columns:
        raise DocumentStoreError(f"{path} has no '{DOCUMENTS_TABLE}' table")
    missing = [c for c in DOCUMENTS_COLUMNS if c not in columns]
    if missing:
        raise DocumentStoreError(f"{path}: table '{DOCUMENTS_TABLE}' lacks columns {missing}")
