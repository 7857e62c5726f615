"""What an ingested data version holds, read straight from its files: each passage's document and text
(its SQLite tables), each vector by id (its IVFFlat index's inverted lists, as stored)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import faiss
import numpy as np


def passages(version_dir: Path) -> dict[int, tuple[str, str]]:
    """passage id -> (its document's id, its text)."""
    conn = sqlite3.connect(f"{(version_dir / 'documents' / 'documents.db').resolve().as_uri()}?mode=ro", uri=True)
    try:
        return {pid: (doc, text) for pid, doc, text in conn.execute(
            "SELECT p.doc_id, p.document_id, d.content FROM passages p JOIN documents d ON d.doc_id = p.doc_id")}
    finally:
        conn.close()


def vectors_by_id(index_path: Path) -> dict[int, np.ndarray]:
    """Every vector of an IndexIVFFlat file by its id, its bytes as stored."""
    index = faiss.read_index(str(index_path))
    invlists = index.invlists
    found = {}
    for lst in range(index.nlist):
        size = invlists.list_size(lst)
        if not size:
            continue
        ids = faiss.rev_swig_ptr(invlists.get_ids(lst), size).copy()
        codes = faiss.rev_swig_ptr(invlists.get_codes(lst), size * index.code_size).copy()
        for row, pid in enumerate(ids):
            found[int(pid)] = codes[row * index.code_size : (row + 1) * index.code_size].view(np.float32)
    return found
