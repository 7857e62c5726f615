"""builders.ingest's readers and source walking: each format's documents (id, title, URL, sections under
their headings) and each kind of bad input skipped with its reason."""
from __future__ import annotations

import json

import pytest

from builders.ingest.documents import Skip
from builders.ingest.html import html_document
from builders.ingest.pdf import pdf_document
from builders.ingest.records import RecordFields
from builders.ingest.sources import InvalidSource, ReadOptions, expand, read_sources
from builders.ingest.text import decode, markdown_sections
from tests.support.pdfs import write_pdf

PAGE = b"""<!doctype html><html><head><title>Returns | Acme Help</title>
<link rel="canonical" href="https://help.example.com/returns"><style>body { color: red }</style>
<script>var tracking = "do not index";</script></head>
<body><nav><a href="/">Home</a> | <a href="/faq">FAQ menu</a></nav>
<header>Acme header banner</header>
<main><h1>Returns<a class="headerlink" href="#r">\xc2\xb6</a></h1><p>Send it back within   30 days.</p>
<h2>Damaged items</h2><p>Photograph the <b>damage</b> first.</p><ul><li>Keep the box</li><li>Keep the label</li></ul>
<h3>Refund time</h3><pre>refund = price
  - shipping</pre>
<h2>Exchanges</h2><p>Exchanges ship free.</p></main>
<footer>Copyright footer</footer></body></html>"""


def test_html_keeps_the_main_text_under_its_headings_and_drops_the_page_furniture():
    sections, title, url = html_document(PAGE)
    assert title == "Returns | Acme Help"
    assert url == "https://help.example.com/returns"
    assert [s.headings for s in sections] == [("Returns",), ("Returns", "Damaged items"),
                                              ("Returns", "Damaged items", "Refund time"), ("Returns", "Exchanges")]
    assert sections[0].text == "Returns\n\nSend it back within 30 days."
    assert sections[1].text == "Damaged items\n\nPhotograph the damage first.\n\nKeep the box\nKeep the label"
    assert "refund = price\n  - shipping" in sections[2].text  # preformatted text keeps its lines
    everything = "\n".join(s.text for s in sections)
    for furniture in ("tracking", "color: red", "FAQ menu", "header banner", "Copyright", "\xb6"):
        assert furniture not in everything


def test_html_without_a_title_takes_its_first_heading_and_without_text_is_skipped():
    sections, title, url = html_document(b"<html><body><h2>Billing</h2><p>Cards only.</p></body></html>")
    assert (title, url) == ("Billing", None)
    with pytest.raises(Skip) as skipped:
        html_document(b"<html><head><title>x</title><script>1</script></head><body><nav>menu</nav></body></html>")
    assert skipped.value.reason == "empty"


def test_markdown_sections_follow_atx_and_setext_headings_but_not_code_fences():
    text = ("# Guide\nIntro line.\n\n## Install\nRun it.\n```\n# not a heading\n```\n"
            "Usage\n-----\nCall it.\n\n### Flags\nNone.\n# Appendix\nEnd.\n")
    sections, title = markdown_sections(text)
    assert title == "Guide"
    assert [s.headings for s in sections] == [("Guide",), ("Guide", "Install"), ("Guide", "Usage"),
                                              ("Guide", "Usage", "Flags"), ("Appendix",)]
    assert "# not a heading" in sections[1].text
    assert sections[2].text == "Usage\nCall it."


def test_markdown_front_matter_title_wins():
    sections, title = markdown_sections("---\ntitle: \"Shipping FAQ\"\n---\n# Shipping\nFast.\n")
    assert title == "Shipping FAQ"
    assert sections[0].headings == ("Shipping",)


@pytest.mark.parametrize("data, reason", [(b"\x00\x01\x02binary", "binary"), (b"caf\xe9 au lait", "undecodable text"),
                                          (b"  \n\t ", "empty")])
def test_decode_refuses_what_is_not_text(data, reason):
    with pytest.raises(Skip) as skipped:
        decode(data)
    assert skipped.value.reason == reason


def test_pdf_pages_become_sections_with_the_metadata_title(tmp_path):
    path = write_pdf(tmp_path / "manual.pdf", [["Warranty covers two years."], ["Batteries: six months."]],
                     title="Acme Manual")
    sections, title = pdf_document(path.read_bytes())
    assert title == "Acme Manual"
    assert [s.headings for s in sections] == [("Page 1",), ("Page 2",)]
    assert "Warranty covers two years." in sections[0].text and "six months" in sections[1].text


def test_encrypted_and_image_only_pdfs_are_skipped_with_their_reason(tmp_path):
    with pytest.raises(Skip) as encrypted:
        pdf_document(write_pdf(tmp_path / "locked.pdf", [["secret"]], password="pw").read_bytes())
    assert encrypted.value.reason == "encrypted PDF"
    with pytest.raises(Skip) as blank:
        pdf_document(write_pdf(tmp_path / "scan.pdf", [[], []]).read_bytes())
    assert blank.value.reason == "no text in PDF"
    with pytest.raises(Skip) as broken:
        pdf_document(b"%PDF-1.4\nthis is not really a pdf")
    assert broken.value.reason == "unreadable"


def test_a_folder_walk_reads_every_format_with_ids_titles_and_urls(tmp_path):
    src = tmp_path / "kb"
    (src / "guides" / "deep").mkdir(parents=True)
    (src / "guides" / "returns.md").write_text("# Returns\nWithin 30 days.\n")
    (src / "guides" / "deep" / "page.html").write_bytes(PAGE)
    (src / "notes.txt").write_text("Plain notes about shipping.\n")
    write_pdf(src / "manual.pdf", [["PDF text here."]])
    (src / "faq.jsonl").write_text(json.dumps({"key": "q1", "name": "Q one", "body": "Answer one.", "link": "https://x/1"})
                                   + "\n" + json.dumps({"key": "q2", "body": "Answer two."}) + "\n")
    (src / "table.csv").write_text("key,name,body\nc1,Row one,Text of row one\n")
    (src / "logo.png").write_bytes(b"\x89PNG")
    (src / ".hidden.md").write_text("# hidden\n")
    files, other = expand([str(src)])
    assert other == 1  # logo.png; the hidden file is not even counted
    options = ReadOptions(fields=RecordFields(id="key", title="name", text="body", url="link"),
                          base_url="https://kb.example.com/")
    read = read_sources(files, options)
    assert not read.skipped
    got = {d.id: (d.title, d.url, d.format) for d in read.documents}
    assert got["guides/returns.md"] == ("Returns", "https://kb.example.com/guides/returns.md", "markdown")
    assert got["guides/deep/page.html"] == ("Returns | Acme Help", "https://help.example.com/returns", "html")
    assert got["notes.txt"] == ("notes.txt", "https://kb.example.com/notes.txt", "text")
    assert got["manual.pdf"] == ("manual.pdf", "https://kb.example.com/manual.pdf", "pdf")
    assert got["q1"] == ("Q one", "https://x/1", "jsonl")
    assert got["q2"] == ("q2", None, "jsonl")
    assert got["c1"] == ("Row one", None, "csv")
    assert len(got) == 7


def test_globs_and_single_files_are_sources_too(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.md").write_text("# One\nx\n")
    (tmp_path / "a" / "two.txt").write_text("two\n")
    files, _ = expand([str(tmp_path / "a" / "*.md"), str(tmp_path / "a" / "two.txt")])
    assert [(f.relative, f.root) for f in files] == [("one.md", tmp_path / "a"), ("two.txt", tmp_path / "a")]
    with pytest.raises(InvalidSource, match="matches no file"):
        expand([str(tmp_path / "*.nothing")])
    with pytest.raises(InvalidSource, match="no file, folder"):
        expand([str(tmp_path / "missing")])


def test_every_kind_of_bad_input_is_skipped_with_its_reason(tmp_path):
    src = tmp_path / "bad"
    src.mkdir()
    (src / "good.md").write_text("# Good\nA fine document.\n")
    (src / "zz-copy.md").write_text("# Good\nA fine document.\n")
    (src / "empty.txt").write_text("")
    (src / "binary.txt").write_bytes(b"\x00\x00\x00ELF")
    (src / "latin1.txt").write_bytes(b"na\xefve")
    (src / "big.txt").write_text("x" * 5000)
    write_pdf(src / "locked.pdf", [["secret"]], password="pw")
    write_pdf(src / "scan.pdf", [[]])
    (src / "records.jsonl").write_text('{"id": "r1", "text": "ok"}\n{"id": "r2", "title": "no text"}\nnot json\n')
    (src / "gone.md").symlink_to(tmp_path / "nowhere.md")  # listed, but cannot be opened
    files, _ = expand([str(src)])
    read = read_sources(files, ReadOptions(max_file_bytes=4000))
    reasons = {where.replace(str(src) + "/", ""): skip.reason for where, skip in read.skipped}
    expected = {"zz-copy.md": "duplicate", "gone.md": "unreadable", "empty.txt": "empty", "binary.txt": "binary", "latin1.txt": "undecodable text",
                "big.txt": "over size limit", "locked.pdf": "encrypted PDF", "scan.pdf": "no text in PDF",
                "records.jsonl:2": "record without text", "records.jsonl:3": "bad record"}
    assert reasons == expected
    assert sorted(d.id for d in read.documents) == ["good.md", "r1"]
    assert "'good.md'" in str(dict(read.skipped)[str(src / "zz-copy.md")])
    assert read.skipped_by_reason()["duplicate"] == 1 and sum(read.skipped_by_reason().values()) == len(expected)
