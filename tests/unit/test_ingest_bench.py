"""profiling/ingest_bench.py on a few files: pages of Python's HTML documentation (Debian's python3-doc)
and a PDF, read per format and built with the tiny stand-in embedder; --max-docs takes files in turn."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from builders.ingest.sources import SourceFile
from profiling import ingest_bench
from tests.support.pdfs import write_pdf

PAGES = ("bisect.html", "heapq.html", "fnmatch.html")


def test_files_are_taken_in_turn_from_each_source_leaving_out_repeated_bytes(tmp_path):
    for name, text in {"h/0.html": "a", "h/1.html": "b", "h/2.html": "c", "p/0.pdf": "d", "p/1.pdf": "a"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    html = [SourceFile(tmp_path / "h", tmp_path / f"h/{n}.html") for n in range(3)]
    pdf = [SourceFile(tmp_path / "p", tmp_path / f"p/{n}.pdf") for n in range(2)]
    assert ingest_bench.take_in_turn([html, pdf], 3) == ([html[0], pdf[0], html[1]], 0)
    # p/1.pdf holds h/0.html's bytes: left out, and counted.
    assert ingest_bench.take_in_turn([html, pdf], 10) == ([html[0], pdf[0], html[1], html[2]], 1)


@pytest.fixture
def sources(tmp_path) -> list[Path]:
    if not all((ingest_bench.PYTHON_HTML / page).is_file() for page in PAGES):
        pytest.skip(f"no {ingest_bench.PYTHON_HTML} (Debian's python3-doc)")
    html = tmp_path / "html"
    html.mkdir()
    for page in PAGES:
        shutil.copy(ingest_bench.PYTHON_HTML / page, html / page)
    pdfs = tmp_path / "pdf"
    pdfs.mkdir()
    write_pdf(pdfs / "manual.pdf", [["Installing the widget", "Unpack the widget and plug it in."],
                                    ["Cleaning the widget", "Wipe it with a dry cloth."]], title="Widget manual")
    return [html, pdfs]


def test_it_reads_each_format_and_reports_documents_and_passages_per_second(sources, tmp_path, capsys, tool_commit):
    out = tmp_path / "out"
    assert ingest_bench.main([*map(str, sources), "--max-docs", "3", "--out", str(out), "--no-progress"]) == 0
    result = json.loads((out / "ingest_bench.json").read_text())
    # In turn: the first page, the PDF, the second page; never the third (--max-docs 3).
    assert [Path(f).name for f in result["files"]] == ["bisect.html", "manual.pdf", "fnmatch.html"]
    assert [(r["format"], r["files"], r["documents"]) for r in result["reading"]] == [("html", 2, 2), ("pdf", 1, 1)]
    assert all(r["documents_per_s"] > 0 and r["mb_per_s"] > 0 and r["bytes"] > 0 for r in result["reading"])
    assert result["documents"] == 3 and result["passages"] > 3 and result["passages_per_s"] > 0
    assert result["embedder"]["source"] == "standin:tiny" and result["record"]["settings"]["MODEL_SOURCE"] == "standin"
    assert result["record"]["tool"] == tool_commit
    printed = capsys.readouterr().out
    assert "read: 3 documents in" in printed and "passages/s" in printed and f"wrote {out}" in printed
    assert not list(Path(tempfile.gettempdir()).glob("ingest-bench-*/v1"))  # its build is removed


def test_without_any_source_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(ingest_bench, "DEFAULT_SOURCES", (Path("/nonexistent/a"),))
    assert ingest_bench.main(["--max-docs", "1"]) == 2
    assert "apt-get install python3-doc r-doc-pdf" in capsys.readouterr().err
