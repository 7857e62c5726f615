"""PDF with pypdf: each page's text a section under its page number; encrypted or text-less files refused."""
from __future__ import annotations

import io
import logging

from builders.ingest.documents import Section, Skip
from builders.ingest.text import tidy


def pdf_document(data: bytes) -> tuple[tuple[Section, ...], str | None]:
    """(sections, the title in the PDF's metadata or None)."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd files would drown the report
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # A file with an owner password only opens with the empty user password; any other cannot be read.
            try:
                opened = reader.decrypt("")
            except Exception:  # pypdf raises several kinds for unsupported encryption
                opened = 0
            if not opened:
                raise Skip("encrypted PDF", "needs a password")
        sections = []
        for number, page in enumerate(reader.pages, 1):
            text = tidy(page.extract_text() or "")
            if text:
                sections.append(Section((f"Page {number}",), text))
        title = (reader.metadata.title or "").strip() if reader.metadata else ""
    except Skip:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise Skip("unreadable", f"not a readable PDF ({exc})") from None
    if not sections:
        raise Skip("no text in PDF", "image-only or empty pages")
    return tuple(sections), title or None
