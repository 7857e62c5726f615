"""builders.ingest.splitter with the embedder's own tokenizer (the tiny stand-in's, bge's vocabulary):
passages within the limit when counted whole, spans of the document's text, cut along headings, then
paragraphs, then sentences, with the overlap asked for."""
from __future__ import annotations

import pytest

from builders.ingest.documents import Section, SourceDocument
from builders.ingest.splitter import SplitSettings, TokenCounter, split_document
from builders.ingest.text import markdown_sections


@pytest.fixture(scope="module")
def counter(embedder) -> TokenCounter:
    return TokenCounter(embedder.model.tokenizer)


def document(text: str) -> SourceDocument:
    sections, title = markdown_sections(text)
    return SourceDocument("doc.md", title or "doc", None, "markdown", sections)


def sentence(i: int) -> str:
    return f"Sentence number {i} says that parcel {i * 7} leaves the depot on day {i % 5}."


def test_a_short_document_is_one_passage_per_section_carrying_its_heading(counter):
    doc = document("# Returns\nSend it back.\n\n## Refunds\nMoney back in five days.\n")
    passages = split_document(doc, counter, SplitSettings(limit=64, target=48, overlap=8))
    assert [(p.headings, p.text) for p in passages] == [
        (("Returns",), "Returns\nSend it back."), (("Returns", "Refunds"), "Refunds\nMoney back in five days.")]
    for p in passages:
        assert doc.text[p.char_start : p.char_end] == p.text
        assert p.tokens == counter.count([p.text])[0]


def test_passages_fit_the_limit_counted_whole_and_keep_near_the_target(counter):
    paragraphs = "\n\n".join(" ".join(sentence(10 * p + s) for s in range(3)) for p in range(20))
    doc = document("# Long\n" + paragraphs)
    settings = SplitSettings(limit=128, target=96, overlap=0)
    passages = split_document(doc, counter, settings)
    counts = counter.count([p.text for p in passages])
    assert counts == [p.tokens for p in passages]
    assert max(counts) <= settings.limit
    assert sum(c > settings.target for c in counts) == 0  # paragraphs are far smaller than the target here
    assert len(passages) > 5 and all(c > settings.target // 3 for c in counts[:-1])  # packed, not one per paragraph
    # No overlap: the spans tile the text in order.
    assert all(a.char_end < b.char_start for a, b in zip(passages, passages[1:]))
    assert all(p.text[0] != " " and p.text[-1] != " " for p in passages)


def test_overlap_repeats_the_last_paragraphs_of_the_passage_before(counter):
    paragraphs = "\n\n".join(sentence(p) for p in range(30))
    doc = document(paragraphs)
    passages = split_document(doc, counter, SplitSettings(limit=128, target=80, overlap=30))
    assert len(passages) > 3
    for before, after in zip(passages, passages[1:]):
        assert after.char_start < before.char_end  # overlapping spans
        assert before.text.endswith(doc.text[after.char_start : before.char_end])
        assert counter.count([doc.text[after.char_start : before.char_end]])[0] - counter.special_tokens <= 30


def test_a_paragraph_over_the_limit_is_cut_at_sentences_and_a_sentence_over_it_at_tokens(counter):
    long_paragraph = " ".join(sentence(i) for i in range(40))
    run_on = " ".join(f"word{i}" for i in range(600))  # one "sentence" of well over 512 tokens
    doc = document(f"# A\n{long_paragraph}\n\n# B\n{run_on}\n")
    settings = SplitSettings(limit=64, target=64, overlap=0)
    passages = split_document(doc, counter, settings)
    assert max(counter.count([p.text for p in passages])) <= 64
    in_a = [p for p in passages if p.headings == ("A",)]
    assert all(p.text.endswith(".") for p in in_a)  # whole sentences
    in_b = [p for p in passages if p.headings == ("B",)]
    run_on_tokens = counter.count([run_on])[0] - counter.special_tokens
    assert run_on_tokens > 512
    assert len(in_b) >= run_on_tokens // (64 - counter.special_tokens)  # windows of at most 62 tokens
    covered = "".join("".join(p.text.split()) for p in in_b)
    assert covered == "".join(("B " + run_on).split())  # nothing lost between windows


def test_passages_never_cross_a_heading(counter):
    doc = SourceDocument("d", "d", None, "html", (Section(("X",), "X\n\nshort one"), Section(("Y",), "Y\n\nshort two")))
    passages = split_document(doc, counter, SplitSettings(limit=512, target=500, overlap=0))
    assert [p.headings for p in passages] == [("X",), ("Y",)]
    assert [p.text for p in passages] == ["X\n\nshort one", "Y\n\nshort two"]


@pytest.mark.parametrize("kwargs, message", [(dict(limit=64, target=65), "--target-tokens"),
                                             (dict(limit=64, target=32, overlap=32), "--overlap-tokens"),
                                             (dict(limit=4), "at least 8")])
def test_settings_out_of_range_are_refused_naming_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SplitSettings(**kwargs)
