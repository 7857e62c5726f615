"""Documents cut into passages along their structure, counted in the embedder's own tokens.

Each section (the text under one heading path) is cut into paragraphs; a paragraph over the limit into
sentences; a sentence over the limit at token boundaries. These pieces are packed in order into
passages of about ``target`` tokens, never over ``limit``, and never across a heading; a passage
repeats the last pieces of the one before it, up to ``overlap`` tokens. A passage is a span of its
document's text, and its count is checked as a whole (with the embedder's special tokens) before it is kept.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from builders.ingest.documents import SECTION_BREAK, Passage, SourceDocument

PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class TokenCounter:
    """Counts with a Hugging Face (fast) tokenizer: the embedder's own."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special_tokens = len(tokenizer("", add_special_tokens=True)["input_ids"])

    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text with the special tokens an embedding adds."""
        if not texts:
            return []
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return [len(row) + self.special_tokens for row in ids]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's character span in `text` (no special tokens)."""
        return [tuple(span) for span in self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                                         verbose=False)["offset_mapping"]]


@dataclass(frozen=True)
class SplitSettings:
    limit: int  # the embedder's: no passage is longer, special tokens included
    target: int = 256
    overlap: int = 32

    def __post_init__(self) -> None:
        if self.limit < 8:
            raise ValueError(f"the passage limit must be at least 8 tokens, got {self.limit}")
        if not 1 <= self.target <= self.limit:
            raise ValueError(f"--target-tokens must be between 1 and the embedder's limit ({self.limit}), "
                             f"got {self.target}")
        if not 0 <= self.overlap < self.target:
            raise ValueError(f"--overlap-tokens must be at least 0 and below --target-tokens ({self.target}), "
                             f"got {self.overlap}")

    def as_json(self) -> dict[str, int]:
        return {"limit_tokens": self.limit, "target_tokens": self.target, "overlap_tokens": self.overlap}


@dataclass(frozen=True)
class _Piece:
    start: int  # in the document's text
    end: int
    tokens: int  # counted alone, special tokens included


def split_document(document: SourceDocument, counter: TokenCounter, settings: SplitSettings) -> list[Passage]:
    passages: list[Passage] = []
    offset = 0
    for section in document.sections:
        pieces = _pieces(document.text, offset, offset + len(section.text), counter, settings.limit)
        for start, end in _pack(pieces, counter.special_tokens, settings):
            passages += _checked(document, section.headings, start, end, pieces, counter, settings.limit)
        offset += len(section.text) + len(SECTION_BREAK)
    return passages


def _spans(text: str, start: int, end: int, pattern: re.Pattern) -> list[tuple[int, int]]:
    """The stripped spans of text[start:end] between matches of `pattern`."""
    spans = []
    cursor = start
    for match in [*pattern.finditer(text, start, end), None]:
        stop = match.start() if match else end
        piece = text[cursor:stop]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((cursor + lead, cursor + len(piece.rstrip())))
        cursor = match.end() if match else end
    return spans


def _pieces(text: str, start: int, end: int, counter: TokenCounter, limit: int) -> list[_Piece]:
    pieces: list[_Piece] = []
    paragraphs = _spans(text, start, end, PARAGRAPH_BREAK)
    for (p_start, p_end), tokens in zip(paragraphs, counter.count([text[a:b] for a, b in paragraphs])):
        if tokens <= limit:
            pieces.append(_Piece(p_start, p_end, tokens))
            continue
        sentences = _spans(text, p_start, p_end, SENTENCE_END)
        for (s_start, s_end), s_tokens in zip(sentences, counter.count([text[a:b] for a, b in sentences])):
            if s_tokens <= limit:
                pieces.append(_Piece(s_start, s_end, s_tokens))
            else:
                pieces += _token_windows(text, s_start, s_end, counter, limit)
    return pieces


def _token_windows(text: str, start: int, end: int, counter: TokenCounter, limit: int) -> list[_Piece]:
    """A sentence longer than the limit, cut at token boundaries into windows that fit: a window whose
    text counts over the limit once cut (a word's pieces counted differently) is made smaller."""
    offsets = counter.offsets(text[start:end])
    pieces = []
    first = 0
    while first < len(offsets):
        size = max(1, limit - counter.special_tokens)
        while True:
            stop = min(first + size, len(offsets))
            a, b = start + offsets[first][0], start + offsets[stop - 1][1]
            tokens = counter.count([text[a:b]])[0]
            if tokens <= limit or size == 1:
                break
            size = max(1, size - max(1, tokens - limit))
        pieces.append(_Piece(a, b, tokens))
        first = stop
    return pieces


def _pack(pieces: list[_Piece], special: int, settings: SplitSettings) -> list[tuple[int, int]]:
    """Runs of consecutive pieces (as (first, last + 1) indices) of about `target` tokens, the pieces'
    own counts summed (their special tokens counted once)."""
    runs: list[tuple[int, int]] = []
    first = 0
    total = 0
    for index, piece in enumerate(pieces):
        size = piece.tokens - special
        if index > first and total + size + special > settings.target:
            runs.append((first, index))
            # The new run starts with the last pieces of this one, up to the overlap, if the piece still fits.
            back = index
            kept = 0
            while back - 1 > first and kept + pieces[back - 1].tokens - special <= settings.overlap:
                back -= 1
                kept += pieces[back].tokens - special
            if kept + size + special > settings.limit:
                back, kept = index, 0
            first, total = back, kept
        total += size
    if pieces:
        runs.append((first, len(pieces)))
    return runs


def _checked(document: SourceDocument, headings: tuple[str, ...], first: int, stop: int, pieces: list[_Piece],
             counter: TokenCounter, limit: int) -> list[Passage]:
    """The run as one passage if its text as a whole fits the limit, else its halves (a one-piece run
    always fits: it was counted whole)."""
    start, end = pieces[first].start, pieces[stop - 1].end
    tokens = pieces[first].tokens if stop - first == 1 else counter.count([document.text[start:end]])[0]
    if tokens <= limit or stop - first == 1:
        return [Passage(document, headings, start, end, tokens)]
    middle = (first + stop) // 2
    return (_checked(document, headings, first, middle, pieces, counter, limit)
            + _checked(document, headings, middle, stop, pieces, counter, limit))
