"""SOURCE arguments (folders walked recursively, files, globs) read into documents, or skipped with a reason."""
from __future__ import annotations

import glob
import itertools
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builders.build_files import BuildError
from builders.ingest.documents import Section, Skip, SourceDocument
from builders.ingest.records import RecordFields, record_document, records
from builders.ingest.text import decode, markdown_sections, plain_sections

FORMATS = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".text": "text", ".html": "html",
           ".htm": "html", ".pdf": "pdf", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
DEFAULT_MAX_FILE_BYTES = 50_000_000


class InvalidSource(BuildError, ValueError):
    pass


@dataclass(frozen=True)
class SourceFile:
    """A file to read and the folder its document id is relative to."""
    root: Path
    path: Path

    @property
    def relative(self) -> str:
        return self.path.relative_to(self.root).as_posix()


@dataclass(frozen=True)
class ReadOptions:
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    fields: RecordFields = RecordFields()
    base_url: str | None = None  # a file's URL is base_url + its id when its page names none


@dataclass
class ReadResult:
    """What a read found: the documents in order, each skipped source with its reason, and how many
    files in the walked folders were of no document format."""
    documents: list[SourceDocument] = field(default_factory=list)
    skipped: list[tuple[str, Skip]] = field(default_factory=list)
    other_files: int = 0
    seconds: float = 0.0  # how long the reading took

    def skipped_by_reason(self) -> Counter[str]:
        return Counter(skip.reason for _, skip in self.skipped)


def expand(sources: Sequence[str]) -> tuple[list[SourceFile], int]:
    """The files of the SOURCE arguments in a stable order, and the count of walked files of no known
    format (a file named on its own is read whatever its name, and skipped if of no known format)."""
    files: list[SourceFile] = []
    other = 0
    for source in sources:
        if glob.has_magic(source):
            matches = sorted(glob.glob(source, recursive=True))
            if not matches:
                raise InvalidSource(f"SOURCE {source!r} matches no file")
            root = _glob_root(source)
            for match in map(Path, matches):
                found, skipped = _walk(root, match) if match.is_dir() else ([SourceFile(root, match)], 0)
                files += found
                other += skipped
        elif Path(source).is_dir():
            found, skipped = _walk(Path(source), Path(source))
            files += found
            other += skipped
        elif Path(source).is_file():
            files.append(SourceFile(Path(source).parent, Path(source)))
        else:
            raise InvalidSource(f"SOURCE {source!r} is no file, folder or matching glob")
    return files, other


def _glob_root(pattern: str) -> Path:
    """The folder a glob's matches are relative to: its parts before the first with a wildcard."""
    plain = list(itertools.takewhile(lambda part: not glob.has_magic(part), Path(pattern).parts))
    return Path(*plain) if plain else Path(".")


def _walk(root: Path, folder: Path) -> tuple[list[SourceFile], int]:
    """Every file under `folder` of a known format (hidden files and folders left out), sorted."""
    found: list[SourceFile] = []
    other = 0
    for current, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(current) / name
            if path.suffix.lower() in FORMATS:
                found.append(SourceFile(root, path))
            else:
                other += 1
    return found, other


def read_sources(files: Sequence[SourceFile], options: ReadOptions) -> ReadResult:
    """Each file's documents; a source that cannot be one (or repeats another's id or text) is skipped."""
    result = ReadResult()
    ids: dict[str, str] = {}
    texts: dict[str, str] = {}
    for file in files:
        try:
            read = list(_read_file(file, options))
        except Skip as skip:
            result.skipped.append((str(file.path), skip))
            continue
        for where, document in read:
            if isinstance(document, Skip):
                result.skipped.append((where, document))
            elif document.id in ids:
                result.skipped.append((where, Skip("duplicate id", f"'{document.id}' is also {ids[document.id]}")))
            elif document.text_hash in texts:
                result.skipped.append((where, Skip("duplicate", f"the same text as '{texts[document.text_hash]}'")))
            else:
                ids[document.id] = where
                texts[document.text_hash] = document.id
                result.documents.append(document)
    return result


def _read_file(file: SourceFile, options: ReadOptions) -> Iterator[tuple[str, SourceDocument | Skip]]:
    kind = FORMATS.get(file.path.suffix.lower())
    if kind is None:
        raise Skip("unsupported format", f"'{file.path.suffix or file.path.name}' is none of {', '.join(FORMATS)}")
    try:
        size = file.path.stat().st_size
        if size > options.max_file_bytes:
            raise Skip("over size limit", f"{size} bytes, more than {options.max_file_bytes}")
        data = file.path.read_bytes()
    except OSError as exc:
        raise Skip("unreadable", exc.strerror or str(exc)) from None
    if not data.strip():
        raise Skip("empty")
    where = str(file.path)
    if kind in ("jsonl", "csv"):
        text = decode(data)
        for number, record in records(text, file.path.suffix.lower()):
            record_where = f"{where}:{number}"
            try:
                yield record_where, record_document(record, f"line {number}", f"{file.relative}#{number}",
                                                    options.fields, kind)
            except Skip as skip:
                yield record_where, skip
        return
    sections: tuple[Section, ...]
    url = None
    if kind == "html":
        from builders.ingest.html import html_document
        sections, title, url = html_document(data)
    elif kind == "pdf":
        from builders.ingest.pdf import pdf_document
        sections, title = pdf_document(data)
    elif kind == "markdown":
        sections, title = markdown_sections(decode(data))
    else:
        sections, title = plain_sections(decode(data)), None
    if url is None and options.base_url:
        url = options.base_url + file.relative
    yield where, SourceDocument(id=file.relative, title=title or file.path.name, url=url, format=kind,
                                sections=sections)
