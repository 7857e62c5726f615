"""Markdown and plain text: bytes decoded (or refused), Markdown cut into sections at its headings."""
from __future__ import annotations

import re

from builders.ingest.documents import Section, Skip

ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
FRONT_MATTER_TITLE = re.compile(r"^title:\s*['\"]?(.*?)['\"]?\s*$", re.MULTILINE)
BLANK_RUNS = re.compile(r"\n\s*\n\s*(\n\s*)*")
SNIFF_BYTES = 8192


def decode(data: bytes) -> str:
    """UTF-8 text (a byte-order mark dropped); Skip if it is empty, binary or not UTF-8."""
    if b"\x00" in data[:SNIFF_BYTES]:
        raise Skip("binary", "NUL bytes in a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Skip("undecodable text", f"not UTF-8 at byte {exc.start}") from None
    if not text.strip():
        raise Skip("empty")
    return text


def tidy(text: str) -> str:
    """Lines without trailing blanks, paragraphs separated by exactly one blank line, no outer blanks."""
    lines = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return BLANK_RUNS.sub("\n\n", lines).strip()


def plain_sections(text: str) -> tuple[Section, ...]:
    body = tidy(text)
    if not body:
        raise Skip("empty")
    return (Section((), body),)


def markdown_sections(text: str) -> tuple[tuple[Section, ...], str | None]:
    """The sections under each heading path, and the title (front matter's, else the first top-level
    heading, else the first heading)."""
    text = text.replace("\r\n", "\n")
    title = None
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end > 0:
            match = FRONT_MATTER_TITLE.search(text[4:end])
            title = match.group(1).strip() if match else None
            text = text[end + 4 :].split("\n", 1)[-1]
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    lines: list[str] = []
    headings: list[tuple[int, str]] = []
    fenced = False

    def flush() -> None:
        body = tidy("\n".join(lines))
        if body:
            sections.append(Section(tuple(name for _, name in stack), body))
        lines.clear()

    def open_heading(level: int, name: str) -> None:
        flush()
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, name))
        headings.append((level, name))
        lines.append(name)

    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := ATX_HEADING.match(line)) and match.group(2):
            open_heading(len(match.group(1)), match.group(2).strip())
            continue
        elif (not fenced and lines and lines[-1].strip() and SETEXT_UNDERLINE.match(line)
              and not (len(lines) == 1 and stack and lines[0] == stack[-1][1])):
            name = lines.pop().strip()
            open_heading(1 if line.strip()[0] == "=" else 2, name)
            continue
        lines.append(line)
    flush()
    if not sections:
        raise Skip("empty")
    if title is None and headings:
        top = min(level for level, _ in headings)
        title = next(name for level, name in headings if level == top)
    return tuple(sections), title
