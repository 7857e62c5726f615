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


def test_validate_reply():
    good = spec.answer_json("r1", "Answer: yes", "neutral", "false")
    assert spec.validate_reply(good, "r1") == []
    assert spec.validate_reply({**good, "served_by": 1}, "r1") == []  # extra fields are allowed
    assert spec.validate_reply({**good, "generated_response": ""}, "r1") == []  # a string, even empty
    for sentiment in spec.SENTIMENTS:
        assert spec.validate_reply({**good, "sentiment": sentiment}, "r1") == []
    bad = {"request_id": "r2", "generated_response": None, "sentiment": "happy", "is_toxic": True}
    problems = spec.validate_reply(bad, "r1")
    assert len(problems) == 4
    assert [p.split()[0] for p in problems] == ["request_id", "generated_response", "sentiment", "is_toxic"]
    assert len(spec.validate_reply({k: v for k, v in good.items() if k != "is_toxic"}, "r1")) == 1
    assert spec.validate_reply(["not", "a", "dict"], "r1") and spec.validate_reply(None, "r1")
