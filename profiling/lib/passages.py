"""Real English passages for fidelity checks: the paragraphs of Python's HTML documentation, as
Debian's `python3-doc` installs it. Deterministic: the same docs give the same passages."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

# Debian's python3-doc links this to the documentation of its Python version.
PYTHON_DOCS = Path("/usr/share/doc/python3/html")
# Generated pages (indexes, search) hold lists of names, not prose.
_SKIPPED = re.compile(r"^(genindex|py-modindex|search|contents)\b")


class _Paragraphs(HTMLParser):
    """The text of every <p> element, tags stripped, whitespace collapsed."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "p":
            self._open = []

    def handle_endtag(self, tag):
        if tag == "p" and self._open is not None:
            self.paragraphs.append(" ".join("".join(self._open).split()))
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open.append(data)


def html_paragraphs(text: str) -> list[str]:
    parser = _Paragraphs()
    parser.feed(text)
    parser.close()
    return parser.paragraphs


def _clipped(paragraph: str, max_chars: int) -> str:
    """At most max_chars, cut at a word boundary (the encoder truncates long passages anyway)."""
    if len(paragraph) <= max_chars:
        return paragraph
    cut = paragraph[:max_chars + 1].rsplit(" ", 1)[0]
    return cut if cut else paragraph[:max_chars]


def doc_pages(root: Path = PYTHON_DOCS) -> list[Path]:
    """The documentation's HTML pages, sorted by path (generated index pages left out)."""
    return sorted(p for p in root.rglob("*.html")
                  if not _SKIPPED.match(p.name) and not any(part.startswith("_") for part in p.relative_to(root).parts))


def _spread(count: int) -> list[int]:
    """0..count-1 in a low-discrepancy order (golden-ratio steps): any prefix samples the whole range."""
    return sorted(range(count), key=lambda i: (i * 0.6180339887498949) % 1.0)


def passages(n: int, root: Path = PYTHON_DOCS, *, per_page: int = 8, min_chars: int = 100,
             max_chars: int = 600) -> list[str]:
    """n distinct paragraphs of at least min_chars (clipped to max_chars): up to per_page from each page,
    evenly spaced in it, the pages visited spread over the whole documentation, so a small n reads few
    pages and still samples every part. Fewer than n when the docs hold fewer."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: install Debian's python3-doc")
    pages = doc_pages(root)
    found: dict[str, None] = {}  # ordered, distinct
    for index in _spread(len(pages)):
        kept = [_clipped(p, max_chars) for p in html_paragraphs(pages[index].read_text(encoding="utf-8", errors="replace"))
                if len(p) >= min_chars]
        for j in range(min(per_page, len(kept))):
            found.setdefault(kept[j * len(kept) // min(per_page, len(kept))])
            if len(found) == n:
                return list(found)
    return list(found)
