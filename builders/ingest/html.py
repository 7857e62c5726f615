"""HTML: the page's main text under its headings, without navigation, scripts or styles (selectolax's
lexbor parser: chosen by measurement, docs/ingest.md)."""
from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser, LexborNode

from builders.ingest.documents import Section, Skip
from builders.ingest.text import tidy

# Never text a reader wants: scripts and styles, navigation and page furniture, Sphinx/MkDocs permalinks.
DROPPED = ("script, style, noscript, template, nav, header, footer, aside, form, iframe, svg, "
           "[role=navigation], [role=banner], [role=contentinfo], [role=search], a.headerlink")
MAIN = ("main", "[role=main]", "article")
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
# Elements that end the text before them: each starts a line of its own.
BLOCKS = {"p", "div", "section", "li", "ul", "ol", "dl", "dt", "dd", "pre", "blockquote", "table", "tr",
          "figure", "figcaption", "details", "summary", "br", "hr", "td", "th"}
SPACES = re.compile(r"[ \t\r\n\f\v]+")


def html_document(data: bytes) -> tuple[tuple[Section, ...], str | None, str | None]:
    """(sections, title, canonical URL) of a page; Skip if it holds no text."""
    if b"\x00" in data[:8192]:
        raise Skip("binary", "NUL bytes in an HTML file")
    tree = LexborHTMLParser(data)
    title_node = tree.css_first("title")
    title = SPACES.sub(" ", title_node.text()).strip() if title_node else None
    url = _canonical_url(tree)
    for node in tree.css(DROPPED):
        node.decompose()
    root = next((node for selector in MAIN if (node := tree.css_first(selector)) is not None), None) or tree.body
    if root is None:
        raise Skip("empty", "no <body>")
    walker = _Walker()
    try:
        walker.walk(root)
    except RecursionError:
        raise Skip("unreadable", "HTML nested too deeply") from None
    sections = walker.finish()
    if not sections:
        raise Skip("empty", "no text in the page's body")
    if not title:
        title = next((name for name in (s.headings[0] for s in sections if s.headings)), None)
    return sections, title or None, url


def _canonical_url(tree: LexborHTMLParser) -> str | None:
    for selector, attribute in (("link[rel=canonical]", "href"), ("meta[property='og:url']", "content")):
        node = tree.css_first(selector)
        value = (node.attributes.get(attribute) or "").strip() if node else ""
        if value.startswith(("http://", "https://")):
            return value
    return None


class _Walker:
    """Collects text in document order: a heading closes the section before it and opens its own."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self.stack: list[tuple[int, str]] = []
        self.lines: list[str] = []
        self.line: list[str] = []

    def walk(self, node: LexborNode) -> None:
        for child in node.iter(include_text=True):
            tag = child.tag
            if tag == "-text":
                self.line.append(SPACES.sub(" ", child.text_content or ""))
            elif tag in HEADINGS:
                self._heading(HEADINGS[tag], SPACES.sub(" ", child.text(deep=True)).strip())
            elif tag == "pre":
                self._end_line()
                self.lines.append(child.text(deep=True).rstrip())
                self.lines.append("")
            elif tag in BLOCKS:
                self._end_line()
                self.walk(child)
                self._end_line()
                if tag in ("p", "table", "ul", "ol", "dl", "blockquote", "section", "figure"):
                    self.lines.append("")  # a paragraph's end
            elif tag not in ("-comment", "head"):
                self.walk(child)

    def _end_line(self) -> None:
        text = "".join(self.line).strip()
        if text:
            self.lines.append(text)
        self.line.clear()

    def _heading(self, level: int, name: str) -> None:
        self._flush()
        if not name:
            return
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        self.stack.append((level, name))
        self.lines.extend([name, ""])

    def _flush(self) -> None:
        self._end_line()
        body = tidy("\n".join(self.lines))
        heading = self.stack[-1][1] if self.stack else None
        if body and body != heading:
            self.sections.append(Section(tuple(name for _, name in self.stack), body))
        self.lines.clear()

    def finish(self) -> tuple[Section, ...]:
        self._flush()
        return tuple(self.sections)
