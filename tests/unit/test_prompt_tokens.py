"""PromptTokenizer, the one owner of the LLM's tokenization: the same ids as the tokenizer's own
encoding of a plain prompt, its padding and decoding, and any number of threads at once."""
from __future__ import annotations

import threading

import pytest

from pipeline import spec
from pipeline.docstore import Document
from pipeline.prompt_tokens import PromptTokenizer

DOCS = tuple(Document(i, f"Title {i}", f"Content number {i}: returns, refunds and ünïcödé 😀.", "c")
             for i in range(3))
QUERIES = [*spec.REFERENCE_QUERIES, "日本語 😀 emoji  double  spaces\n\nnew lines", ""]


@pytest.fixture(scope="module")
def hf_tokenizer(model_source):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, padding_side="left", **model_source.hf_kwargs())


@pytest.fixture(scope="module")
def tokens(hf_tokenizer):
    return PromptTokenizer(hf_tokenizer)


def test_plain_prompts_encode_as_the_whole_rendered_text(tokens, hf_tokenizer):
    for i, query in enumerate(QUERIES):
        documents = DOCS[: i % 4]
        text = tokens.render(spec.build_messages(query, documents))
        assert tokens.prompt_ids(query, documents) == hf_tokenizer(text)["input_ids"], query


def test_counts_decoding_and_padding_agree_with_the_tokenizer(tokens, hf_tokenizer):
    for query in QUERIES:
        ids = hf_tokenizer.encode(query, add_special_tokens=False)
        assert tokens.count(query) == len(ids)
        assert tokens.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    rows = [tokens.prompt_ids(q, DOCS[:2]) for q in QUERIES[:3]]
    assert len({len(r) for r in rows}) > 1
    ours = tokens.left_padded(rows)
    theirs = hf_tokenizer.pad({"input_ids": rows}, return_tensors="pt")
    assert ours["input_ids"].equal(theirs["input_ids"]) and ours["attention_mask"].equal(theirs["attention_mask"])


def test_decoding_skips_only_the_special_added_tokens_as_the_tokenizer_does(tokens, hf_tokenizer):
    """Encoding keeps every added token's string as text; decoding still reads the ids as the tokenizer
    marks them: `<tool_call>` (not special) is text, `<|im_end|>` (special) is skipped."""
    added = sorted(hf_tokenizer.added_tokens_decoder)
    ids = [i for token_id in added for i in (token_id, *hf_tokenizer.encode(" x", add_special_tokens=False))]
    assert tokens.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tokens.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids, skip_special_tokens=False)
    assert any(not token.special for token in hf_tokenizer.added_tokens_decoder.values())

def test_threads_share_it_with_no_lock_and_get_what_one_thread_gets(tokens, hf_tokenizer):
    """Request threads count and decode while the generation thread encodes prompts; meanwhile the
    tokenizer it was built from is called with changing padding and truncation (what once made a
    shared fast tokenizer miscount or fail with "Already borrowed"): its own copy never changes."""
    work = [(q, DOCS[: i % 4]) for i, q in enumerate(QUERIES)]
    expected = [(tokens.prompt_ids(q, d), tokens.count(q)) for q, d in work]
    errors: list[BaseException] = []
    start = threading.Barrier(7)

    def use_it():
        try:
            start.wait()
            for _ in range(20):
                for (query, documents), (ids, count) in zip(work, expected):
                    assert tokens.prompt_ids(query, documents) == ids and tokens.count(query) == count
                    assert tokens.decode(ids[-3:]) == tokens.decode(list(ids[-3:]))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def disturb_the_original():
        start.wait()
        for n in range(40):
            hf_tokenizer(QUERIES[:3], padding=bool(n % 2), truncation=bool(n % 3), max_length=8 + n)

    threads = [threading.Thread(target=use_it) for _ in range(6)] + [threading.Thread(target=disturb_the_original)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and errors == []
