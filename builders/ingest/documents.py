"""What the readers make of a source file: documents with their sections, or the reason a file was skipped."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

SECTION_BREAK = "\n\n"


class Skip(Exception):
    """A source (a file, or one record of a file) that is not ingested; the message is the reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # the summary counts skips by this


@dataclass(frozen=True)
class Section:
    """The text under one heading path (outermost heading first; () before any heading). ``text`` starts
    with the heading's own line, so a passage cut from it carries its heading."""
    headings: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class SourceDocument:
    id: str
    title: str
    url: str | None
    format: str
    sections: tuple[Section, ...]

    @cached_property
    def text(self) -> str:
        """The extracted text: the sections' texts joined by a blank line. Passage spans index it."""
        return SECTION_BREAK.join(section.text for section in self.sections)

    @cached_property
    def content_hash(self) -> str:
        """sha256 of what a passage is made of (title, URL and text): equal hashes, equal passages."""
        payload = json.dumps([self.title, self.url, self.text], ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()

    @cached_property
    def text_hash(self) -> str:
        """sha256 of the text alone: two documents with the same text are duplicates."""
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Passage:
    """A span of a document's text (``document.text[char_start:char_end]``), at most the embedder's limit."""
    document: SourceDocument
    headings: tuple[str, ...]
    char_start: int
    char_end: int
    tokens: int

    @property
    def text(self) -> str:
        return self.document.text[self.char_start : self.char_end]
