"""Small PDF files for the ingest tests, written with pypdf: pages of text (Helvetica), blank pages, encrypted."""
from __future__ import annotations

from pathlib import Path

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def write_pdf(path: Path, pages: list[list[str]], *, title: str | None = None, password: str | None = None) -> Path:
    """A PDF with one page per entry of `pages`, each line of it a line of text (an empty list: a page
    with no text, as a scanned image's); the metadata title, and encrypted with `password`, if given."""
    writer = PdfWriter()
    font = writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        if not lines:
            continue
        body = " ".join(f"({_escape(line)}) Tj 0 -16 Td" for line in lines)
        stream = DecodedStreamObject()
        stream.set_data(f"BT /F1 12 Tf 72 720 Td {body} ET".encode("latin-1"))
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
        page[NameObject("/Contents")] = writer._add_object(stream)
    if title:
        writer.add_metadata({"/Title": title})
    if password:
        writer.encrypt(password, algorithm="RC4-128")
    with open(path, "wb") as f:
        writer.write(f)
    return path
