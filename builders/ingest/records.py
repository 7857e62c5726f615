"""JSON lines and CSV: one document a record, its fields named by the command line."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

from builders.ingest.documents import Skip, SourceDocument
from builders.ingest.text import markdown_sections


@dataclass(frozen=True)
class RecordFields:
    """Which field of a record holds its id, title, text and URL."""
    id: str = "id"
    title: str = "title"
    text: str = "text"
    url: str = "url"


def records(text: str, suffix: str) -> Iterator[tuple[int, dict | None]]:
    """(line or row number, the record or None when it is not an object) of a JSON-lines or CSV file."""
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        for number, row in enumerate(reader, 2):  # line 1 is the header
            yield number, row
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            yield number, None
            continue
        yield number, record if isinstance(record, dict) else None


def record_document(record: dict | None, where: str, fallback_id: str, fields: RecordFields,
                    file_format: str) -> SourceDocument:
    """The document of one record; Skip naming the field and the rule it breaks."""
    if record is None:
        raise Skip("bad record", f"{where} is not a JSON object")
    text = record.get(fields.text)
    if not isinstance(text, str) or not text.strip():
        raise Skip("record without text", f"{where} has no non-empty string field '{fields.text}'")
    raw_id = record.get(fields.id)
    doc_id = str(raw_id).strip() if isinstance(raw_id, (str, int)) and str(raw_id).strip() else fallback_id
    sections, heading_title = markdown_sections(text)
    title = record.get(fields.title)
    url = record.get(fields.url)
    return SourceDocument(
        id=doc_id, title=title.strip() if isinstance(title, str) and title.strip() else heading_title or doc_id,
        url=url.strip() if isinstance(url, str) and url.strip() else None, format=file_format, sections=sections)
