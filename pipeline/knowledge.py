"""The ingested knowledge's tables, beside the contract's ``documents`` table (``pipeline.spec``).

An ingested build (``builders.ingest``) keeps the contract's ``documents`` table as the rows that are
embedded, searched, reranked and put in the prompt: there each row is one *passage* (``doc_id``: its
integer row key, the FAISS id; ``title``: its document's title; ``content``: the passage's text;
``category``: its document's format). Two more tables say where each passage comes from:

* ``source_documents``: one row per source document, by its stable string id (its path under the
  source root, or a record's id field), with its title, URL (or NULL), content hash and passage count;
* ``passages``: one row per ``documents`` row, naming its document, its heading path (the headings
  above it, joined by :data:`HEADING_SEPARATOR`) and its character span in the document's extracted text.

A build without these tables (``builders.data --kind course/support``) is read as before: its rows
are their own sources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE_DOCUMENTS_TABLE = "source_documents"
PASSAGES_TABLE = "passages"
HEADING_SEPARATOR = " > "

SOURCE_DOCUMENTS_SCHEMA = (
    f"CREATE TABLE {SOURCE_DOCUMENTS_TABLE} (id TEXT PRIMARY KEY, title TEXT NOT NULL, url TEXT, "
    "content_hash TEXT NOT NULL, format TEXT NOT NULL, passages INTEGER NOT NULL)")
PASSAGES_SCHEMA = (
    f"CREATE TABLE {PASSAGES_TABLE} (doc_id INTEGER PRIMARY KEY, document_id TEXT NOT NULL, "
    "heading TEXT NOT NULL, char_start INTEGER NOT NULL, char_end INTEGER NOT NULL, tokens INTEGER NOT NULL)")
PASSAGES_BY_DOCUMENT = f"CREATE INDEX passages_by_document ON {PASSAGES_TABLE} (document_id)"
KNOWLEDGE_SCHEMA = (SOURCE_DOCUMENTS_SCHEMA, PASSAGES_SCHEMA, PASSAGES_BY_DOCUMENT)

SOURCE_DOCUMENT_COLUMNS = ("id", "title", "url", "content_hash", "format", "passages")
PASSAGE_COLUMNS = ("doc_id", "document_id", "heading", "char_start", "char_end", "tokens")


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a passage comes from: its document's id, title and URL, and the headings above it."""
    document: str
    title: str
    heading: str
    url: str | None

    def as_source(self, passage_id: int) -> dict[str, Any]:
        """The passage as a reply's ``sources`` entry names it (docs/contract.md)."""
        return {"id": passage_id, "document": self.document, "title": self.title, "heading": self.heading,
                "url": self.url}
