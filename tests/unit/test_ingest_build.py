"""`python -m builders.ingest` in-process with the tiny stand-in embedder: a folder of every format built
into a data version the document store reads passage by passage with its source; the next version
from a changed folder embeds only the changed documents' passages and keeps every other vector bit for
bit; bad input, --strict, the retrain threshold and an interrupted ingest."""
from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

import builders.incremental
import builders.ingest.build
from builders.ingest.cli import main
from builders.ingest.embedding import from_embedder
from pipeline.data_version import embedder_info, load_version
from pipeline.docstore import DocumentStore
from tests.helpers import leftovers
from tests.support.ingested import passages, vectors_by_id
from tests.support.pdfs import write_pdf

FAQ = [{"id": "faq-1", "title": "Lost parcel", "text": "A parcel lost for ten days is refunded in full.",
        "url": "https://help.example.com/faq/1"},
       {"id": "faq-2", "title": "Gift wrap", "text": "Gift wrapping costs two euros per item."}]


class CountingEmbedder:
    """The stand-in embedder for ingest, counting the texts it embeds."""

    def __init__(self, embedder, identity):
        self.inner = from_embedder(embedder, identity)
        self.texts: list[str] = []

    def __call__(self):
        def embed(texts):
            self.texts += texts
            return self.inner.embed(texts)
        return type(self.inner)(embed, self.inner.identity, self.inner.counter, self.inner.limit)


@pytest.fixture
def counting(embedder, model_source):
    return CountingEmbedder(embedder, embedder_info(model_source, "float32", 768))


def knowledge_folder(root):
    src = root / "kb"
    (src / "guides").mkdir(parents=True)
    (src / "guides" / "returns.md").write_text(
        "# Returns\nSend an item back within thirty days.\n\n## Damaged items\n"
        + "\n\n".join(f"Step {i}: photograph the damage from side {i} before packing it again." for i in range(12)))
    (src / "guides" / "shipping.html").write_text(
        "<html><head><title>Shipping times</title><script>x()</script></head><body><nav>menu</nav><main>"
        "<h1>Shipping</h1><p>Standard shipping takes three to five working days.</p>"
        "<h2>Express</h2><p>Express parcels arrive the next working day.</p></main></body></html>")
    (src / "notes.txt").write_text("Warehouse opening hours are eight to six.\n")
    write_pdf(src / "warranty.pdf", [["Electronics carry a two year warranty."]], title="Warranty terms")
    (src / "faq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in FAQ))
    return src


def ingest(*args: str, factory) -> int:
    return main([*args, "--no-progress", "--target-tokens", "48", "--overlap-tokens", "8"], embedder_factory=factory)


def test_a_folder_of_every_format_becomes_a_version_of_passages_with_their_sources(tmp_path, counting, capsys):
    src = knowledge_folder(tmp_path)
    assert ingest(str(src), "--out", str(tmp_path / "data" / "v1"), factory=counting) == 0
    out = capsys.readouterr().out
    version = tmp_path / "data" / "v1"
    manifest = load_version(version)
    table = passages(version)
    assert manifest.kind == "ingest" and manifest.documents == len(table) == len(counting.texts)
    assert f"ingested 6 documents into {len(table)} passages: data version v1" in out
    assert {doc for doc, _ in table.values()} == {"guides/returns.md", "guides/shipping.html", "notes.txt",
                                                   "warranty.pdf", "faq-1", "faq-2"}
    assert manifest.ingest["formats"] == {"markdown": 1, "html": 1, "text": 1, "pdf": 1, "jsonl": 2}
    assert manifest.ingest["split"] == {"limit_tokens": 512, "target_tokens": 48, "overlap_tokens": 8}
    assert len([p for p in table.values() if p[0] == "guides/returns.md"]) > 2  # the long guide is cut
    assert faiss.read_index(str(version / "faiss_index.bin")).ntotal == len(table)
    with DocumentStore(version / "documents") as store:
        assert store.has_passages
        fetched = store.fetch(sorted(table))
        sources = {d.doc_id: d.as_source() for d in fetched}
    express = next(s for s in sources.values() if "next working day" in fetched[s["id"]].content)
    assert express["document"] == "guides/shipping.html" and express["title"] == "Shipping times"
    assert express["heading"] == "Shipping > Express" and express["url"] is None
    faq = next(s for s in sources.values() if s["document"] == "faq-1")
    assert (faq["title"], faq["url"]) == ("Lost parcel", "https://help.example.com/faq/1")
    assert next(s for s in sources.values() if s["document"] == "warranty.pdf")["title"] == "Warranty terms"


def test_the_next_version_embeds_only_changed_documents_and_keeps_every_other_vector(tmp_path, counting, capsys):
    src = knowledge_folder(tmp_path)
    data = tmp_path / "data"
    assert ingest(str(src), "--out", str(data / "v1"), factory=counting) == 0
    before = passages(data / "v1")
    (src / "notes.txt").write_text("Warehouse opening hours are nine to five, Saturdays included.\n")  # changed
    (src / "guides" / "shipping.html").unlink()  # deleted
    (src / "guides" / "pickup.md").write_text("# Pickup\nCollect orders at the counter with your order code.\n")
    counting.texts.clear()
    assert ingest(str(src), "--out", str(data / "v2"), "--from", str(data / "v1"), factory=counting) == 0
    out = capsys.readouterr().out
    assert "documents: 1 added, 1 changed, 1 deleted, 4 unchanged" in out
    after = passages(data / "v2")
    new_ids = sorted(set(after) - set(before))
    assert sorted(counting.texts) == sorted(after[pid][1] for pid in new_ids)  # only those were embedded
    assert {after[pid][0] for pid in new_ids} == {"notes.txt", "guides/pickup.md"}
    assert min(new_ids) > max(before)  # an id never names two texts
    assert not any(doc == "guides/shipping.html" for doc, _ in after.values())
    assert f"passages embedded: {len(new_ids)} " in out
    old_vectors = vectors_by_id(data / "v1" / "faiss_index.bin")
    new_vectors = vectors_by_id(data / "v2" / "faiss_index.bin")
    assert set(new_vectors) == set(after)
    kept = [pid for pid in after if pid in before]
    assert kept and all(np.array_equal(old_vectors[pid], new_vectors[pid]) for pid in kept)
    manifest = load_version(data / "v2")
    assert manifest.parent == "v1" and manifest.kind == "ingest"
    assert manifest.ingest["embedded_passages"] == len(new_ids)
    assert manifest.index["trained_vectors"] == len(before)
    with DocumentStore(data / "v2" / "documents") as store:
        assert store.fetch([pid for pid, (doc, _) in before.items() if doc == "guides/shipping.html"]) == []


def test_past_the_retrain_share_the_next_version_is_built_in_full_and_says_why(tmp_path, counting, capsys):
    src = knowledge_folder(tmp_path)
    data = tmp_path / "data"
    assert ingest(str(src), "--out", str(data / "v1"), factory=counting) == 0
    (src / "notes.txt").write_text("Warehouse opening hours changed again.\n")
    counting.texts.clear()
    assert ingest(str(src), "--out", str(data / "v2"), "--from", str(data / "v1"), "--retrain-share", "0.01",
                  factory=counting) == 0
    out = capsys.readouterr().out
    assert "quantizer trained again (a full build)" in out and "more than --retrain-share 0.01" in out
    manifest = load_version(data / "v2")
    assert manifest.parent == "v1" and manifest.index["changed_since_training"] == 0
    assert len(counting.texts) == manifest.documents  # every passage embedded again


@pytest.mark.parametrize("since, total, resplit, expected", [
    (40, 110, False, None), (51, 110, False, "more than --retrain-share 0.5"), (10, 200, False, "at least twice"),
    (0, 100, True, "passage settings differ")])
def test_the_quantizer_is_trained_again_past_the_share_or_at_twice_the_count(since, total, resplit, expected):
    why = builders.ingest.build._retrain_reason(since, 100, total, 0.5, resplit)
    assert why is None if expected is None else expected in why


def test_bad_files_are_reported_each_with_its_reason_and_strict_refuses_them(tmp_path, counting, capsys):
    src = knowledge_folder(tmp_path)
    (src / "empty.md").write_text("")
    (src / "blob.txt").write_bytes(b"\x00\x01\x02")
    write_pdf(src / "locked.pdf", [["secret"]], password="pw")
    (src / "more.jsonl").write_text('{"id": "x", "title": "no text here"}\n')
    assert ingest(str(src), "--out", str(tmp_path / "data" / "v1"), "--strict", factory=counting) == 1
    err = capsys.readouterr().err
    for name, reason in (("empty.md", "empty"), ("blob.txt", "binary"), ("locked.pdf", "encrypted PDF"),
                         ("more.jsonl:1", "record without text")):
        assert f"skipped {src / name}: {reason}" in err
    assert "skipped 4 source(s): binary 1, empty 1, encrypted PDF 1, record without text 1" in err
    assert "--strict: 4 source(s) would be skipped" in err
    assert not (tmp_path / "data" / "v1").exists() and counting.texts == []
    assert ingest(str(src), "--out", str(tmp_path / "data" / "v1"), factory=counting) == 0  # without --strict
    assert load_version(tmp_path / "data" / "v1").ingest["skipped"] == {"binary": 1, "empty": 1, "encrypted PDF": 1,
                                                                        "record without text": 1}


def test_an_interrupted_ingest_leaves_no_version(tmp_path, counting, monkeypatch, capsys):
    src = knowledge_folder(tmp_path)
    data = tmp_path / "data"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(builders.ingest.build, "write_ivfflat", interrupted)
    assert ingest(str(src), "--out", str(data / "v1"), factory=counting) == 130
    assert leftovers(data / "v1") == []
    monkeypatch.undo()
    assert ingest(str(src), "--out", str(data / "v1"), factory=counting) == 0
    v1_files = {path: path.read_bytes() for path in leftovers(data / "v1")}
    (src / "notes.txt").write_text("Changed notes.\n")
    monkeypatch.setattr(builders.incremental, "_write_shard", interrupted)
    assert ingest(str(src), "--out", str(data / "v2"), "--from", str(data / "v1"), factory=counting) == 130
    assert leftovers(data / "v2") == []
    assert {path: path.read_bytes() for path in leftovers(data / "v1")} == v1_files  # the previous version untouched


def test_an_ingested_version_is_not_updated_by_doc_id_changes(tmp_path, counting, capsys):
    import builders.data
    src = knowledge_folder(tmp_path)
    assert ingest(str(src), "--out", str(tmp_path / "v1"), factory=counting) == 0
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"doc_id": 0, "delete": True}) + "\n")
    assert builders.data.main(["update", "--from", str(tmp_path / "v1"), "--out", str(tmp_path / "v2"),
                               "--changes", str(changes)]) == 2
    assert "builders.ingest SOURCE... --from" in capsys.readouterr().err and not (tmp_path / "v2").exists()


def test_from_a_version_that_is_not_an_ingest_is_refused(tmp_path, counting, capsys, support_data):
    src = knowledge_folder(tmp_path)
    assert ingest(str(src), "--out", str(tmp_path / "v2"), "--from", str(support_data.db_path.parent.parent),
                  factory=counting) == 2
    assert "not an ingest" in capsys.readouterr().err
