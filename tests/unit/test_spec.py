"""The SPEC facts: prompt text, top 3, 200-character snippets, labels, thresholds."""
from dataclasses import dataclass

import pytest

from pipeline import spec


@dataclass(frozen=True)
class Doc:
    title: str
    content: str


DOCS = [Doc(f"Document {i}", f"Content {i} " + "x" * 300) for i in range(5)]


def test_exact_prompt_messages():
    messages = spec.build_messages("How do I return a defective product?", DOCS)
    assert messages[0] == {"role": "system",
                           "content": "When given Context and Question, reply as 'Answer: <final answer>' only."}
    context = "\n".join(f"- Document {i}: {DOCS[i].content[:200]}" for i in range(3))
    assert messages[1] == {"role": "user", "content":
                           f"Context:\n{context}\n\nQuestion: How do I return a defective product?\n\nAnswer:"}
    assert len(messages) == 2


def test_top_three_and_200_characters():
    context = spec.build_context(DOCS)
    lines = context.split("\n")
    assert len(lines) == 3
    assert [line.split(":")[0] for line in lines] == ["- Document 0", "- Document 1", "- Document 2"]
    assert all(len(line) == len("- Document 0: ") + 200 for line in lines)
    assert spec.build_context(DOCS[:1]) == f"- Document 0: {DOCS[0].content[:200]}"
    assert spec.build_context([]) == ""


@pytest.mark.parametrize("label,sentiment", [
    ("1 star", "very negative"), ("2 stars", "negative"), ("3 stars", "neutral"),
    ("4 stars", "positive"), ("5 stars", "very positive"), ("6 stars", "neutral"), ("", "neutral"),
])
def test_star_mapping(label, sentiment):
    assert spec.sentiment_from_label(label) == sentiment


def test_toxicity_threshold_both_sides():
    assert spec.is_toxic_flag(0.5) == "false"
    assert spec.is_toxic_flag(0.5000001) == "true"
    assert spec.is_toxic_flag(0.4999) == "false"
    assert spec.is_toxic_flag(0.99) == "true"


def test_classifier_text_truncated_to_512_characters():
    assert spec.classifier_text("a" * 1000) == "a" * 512
    assert spec.classifier_text("short") == "short"


def test_constants():
    assert (spec.EMBED_DIM, spec.TOP_K, spec.MAX_NEW_TOKENS, spec.TRUNCATE_LENGTH) == (768, 10, 128, 512)
    assert len(spec.REFERENCE_QUERIES) == 8
