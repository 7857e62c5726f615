"""DocumentStore: batched fetch semantics, one query per batch, read-only, threads."""
from __future__ import annotations

import dataclasses
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from builders.corpus import course_document
from pipeline.docstore import Document, DocumentStore, DocumentStoreError

N_ROWS = 50


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs with space") / "documents.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE documents (doc_id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                 "content TEXT NOT NULL, category TEXT NOT NULL)")
    conn.executemany("INSERT INTO documents VALUES (?, ?, ?, ?)",
                     [course_document(i).as_row() for i in range(N_ROWS)])
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def store(db_path):
    with DocumentStore(db_path) as s:
        yield s


def ids_of(docs: list[Document]) -> list[int]:
    return [d.doc_id for d in docs]


def count_selects(store: DocumentStore) -> list[str]:
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    return statements


def test_fetch_batch_keeps_order_and_skips_missing(store):
    batch = [[3, 1, 2], [2, 999, -1, 3], [], [-1, -1], [7, 7], np.array([5, 4], dtype=np.int64)]
    result = store.fetch_batch(batch)
    assert [ids_of(r) for r in result] == [[3, 1, 2], [2, 3], [], [], [7, 7], [5, 4]]
    assert result[0][0] == course_document(3)


def test_one_select_per_batch(store):
    statements = count_selects(store)
    store.fetch_batch([[1, 2, 3], [3, 2, 1, 40], [49, 1, 999, -1]])
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 1
    # Ids are deduplicated across the batch; -1 never reaches SQL.
    in_list = selects[0].rsplit("IN (", 1)[1].rstrip(")")
    assert sorted(int(i) for i in in_list.split(",")) == [1, 2, 3, 40, 49, 999]


def test_chunks_above_variable_limit(store, monkeypatch):
    monkeypatch.setattr(store, "_max_vars", 4)
    statements = count_selects(store)
    result = store.fetch_batch([list(range(10)), [9, 8, 11]])
    assert [ids_of(r) for r in result] == [list(range(10)), [9, 8, 11]]
    assert sum(s.startswith("SELECT") for s in statements) == 3  # 12 distinct ids / 4


def test_empty_batch_and_fetch_helper(store):
    assert store.fetch_batch([]) == []
    assert ids_of(store.fetch([10, -1, 11])) == [10, 11]
    assert store.count() == N_ROWS


def test_usable_from_other_threads(store):
    requests = [[(i * 7 + j) % (N_ROWS + 5) for j in range(10)] for i in range(40)]
    expected = [[i for i in ids if i < N_ROWS] for ids in requests]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda ids: ids_of(store.fetch_batch([ids])[0]), requests))
    assert results == expected


def test_read_only(store):
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store._conn.execute("DELETE FROM documents")


def test_accepts_documents_dir(db_path):
    with DocumentStore(db_path.parent) as s:
        assert s.path == db_path.resolve()


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="document database not found"):
        DocumentStore(tmp_path / "nope.db")


def test_missing_table(tmp_path):
    path = tmp_path / "documents.db"
    sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    with pytest.raises(DocumentStoreError, match="no 'documents' table"):
        DocumentStore(path)


def test_not_a_database(tmp_path):
    path = tmp_path / "documents.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DocumentStoreError, match="not a readable SQLite database"):
        DocumentStore(path)


def test_document_is_frozen_and_unpacks():
    doc = course_document(6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.title = "x"
    doc_id, title, content, category = doc
    assert (doc_id, title, category) == (6, "Document 6", "shipping")
    assert content == "This is the content of document 6. It contains information about customer support issue 6."


def test_contract_schema_is_the_one_the_store_reads():
    # spec.DOCUMENTS_SCHEMA is what builders.data writes; it must be the SPEC's table, column for column.
    from pipeline import spec
    conn = sqlite3.connect(":memory:")
    conn.execute(spec.DOCUMENTS_SCHEMA)
    info = conn.execute(f"PRAGMA table_info({spec.DOCUMENTS_TABLE})").fetchall()
    conn.close()
    assert spec.DOCUMENTS_TABLE == "documents" and spec.DOCUMENTS_DB == "documents.db"
    assert [(name, kind, notnull, pk) for _, name, kind, notnull, _, pk in info] == [
        ("doc_id", "INTEGER", 0, 1), ("title", "TEXT", 1, 0), ("content", "TEXT", 1, 0), ("category", "TEXT", 1, 0)]
    assert tuple(name for _, name, *_ in info) == spec.DOCUMENTS_COLUMNS
