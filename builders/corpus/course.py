"""The course corpus: ``course_document(i)`` reproduces the course rows exactly (the 4.5M-row contract)."""
from __future__ import annotations

from pipeline.docstore import Document

CATEGORIES = ("technical", "billing", "shipping", "general")


def course_document(i: int) -> Document:
    """Row ``i`` of the course corpus."""
    return Document(
        doc_id=i,
        title=f"Document {i}",
        content=(
            f"This is the content of document {i}. "
            f"It contains information about customer support issue {i % 100}."
        ),
        category=CATEGORIES[i % 4],
    )
