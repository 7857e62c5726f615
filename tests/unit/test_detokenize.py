"""pipeline/detokenize.py on the stand-in Qwen2.5 tokenizer (byte-level BPE, the real one's ids).

The invariant: the pieces and finish(), joined, are exactly the tokenizer's decode of all ids,
and a piece never ends inside a character (no U+FFFD the full decode does not have there)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import spec
from pipeline.detokenize import CONTEXT_TOKENS, REPLACEMENT, IncrementalDetokenizer

TEXTS = [
    "Answer: You can return a defective product within 30 days.",
    " leading space, then  two,   three",
    "Ça coûte 5 € — naïve café, déjà vu, Ångström",
    "Emoji: 😀 👍🏽 👩‍👩‍👧 🇫🇷 done",
    "中文字符和日本語のテキスト、한국어도。",
    "mixed 日本 and 😀 in one\nline\n\n\ttabs",
    "special <|im_end|> in the middle <|endoftext|> of it",
    "<|im_start|>assistant\nAnswer: 😀<|im_end|>",
    "",
]


@pytest.fixture(scope="module")
def tokenizer(model_source):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, **model_source.hf_kwargs())


def stream(tokenizer, ids, skip_special_tokens=True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.finish()


def assert_pieces_match(pieces: list[str], rest: str, full: str) -> None:
    assert "".join(pieces) + rest == full
    offset = 0
    for piece in pieces:  # each piece is the full decode's text at its place, U+FFFD included
        assert full[offset:offset + len(piece)] == piece
        offset += len(piece)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    pieces, rest = stream(tokenizer, ids)
    assert_pieces_match(pieces, rest, full)
    # Valid text: nothing is held back at the end and no piece has a replacement character.
    assert rest == ""
    assert not any(REPLACEMENT in piece for piece in pieces)


@pytest.mark.parametrize("text", TEXTS)
def test_special_tokens_kept_when_asked(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, rest = stream(tokenizer, ids, skip_special_tokens=False)
    assert_pieces_match(pieces, rest, tokenizer.decode(ids, skip_special_tokens=False))


def test_special_tokens_in_the_middle_are_dropped(tokenizer):
    ids = tokenizer.encode("a<|im_end|>b", add_special_tokens=False)
    assert len(ids) == 3 and ids[1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stream(tokenizer, ids) == (["a", "", "b"], "")


def test_a_character_split_over_tokens_comes_out_whole_once_complete(tokenizer):
    ids = tokenizer.encode("x😀", add_special_tokens=False)
    # The stand-in's vocabulary splits the emoji's four bytes over several tokens: the case at hand.
    assert len(ids) > 2 and tokenizer.decode(ids[1:2]) == REPLACEMENT
    pieces, rest = stream(tokenizer, ids)
    assert pieces == ["x"] + [""] * (len(ids) - 2) + ["😀"] and rest == ""


def test_ascii_comes_out_token_by_token(tokenizer):
    ids = tokenizer.encode(" How do I return a defective product?", add_special_tokens=False)
    pieces, _ = stream(tokenizer, ids)
    assert pieces == [tokenizer.decode([i]) for i in ids]


def test_an_unfinished_character_is_held_until_finish(tokenizer):
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]  # cut inside the emoji
    full = tokenizer.decode(ids)
    assert full.endswith(REPLACEMENT)
    pieces, rest = stream(tokenizer, ids)
    assert "".join(pieces) == "ok " and rest == REPLACEMENT


def test_each_push_decodes_a_bounded_window(tokenizer):
    ids = tokenizer.encode("日本語のテキスト 😀 ünïcödé words " * 60, add_special_tokens=False)
    assert len(ids) > 600
    lengths: list[int] = []

    class Recording:
        def decode(self, token_ids, skip_special_tokens=True):
            lengths.append(len(token_ids))
            return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    pieces, rest = stream(Recording(), ids)
    assert "".join(pieces) + rest == tokenizer.decode(ids)
    # At most two decodes a push (one more for finish), none wider than the context plus one
    # character's tokens (up to four bytes) plus the new one: independent of the text's length.
    assert len(lengths) <= 2 * len(ids) + 1
    assert max(lengths) <= CONTEXT_TOKENS + 4 + 1


def test_token_count(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    for i in tokenizer.encode("three small words", add_special_tokens=False):
        detok.push(i)
    assert detok.token_count == len(tokenizer.encode("three small words", add_special_tokens=False))


# Random ids: mostly single-byte tokens (the first 256 ids), where partial and invalid UTF-8
# lives, some anywhere in the vocabulary, some special tokens (151643..151664).
TOKEN_IDS = st.one_of(st.integers(0, 300), st.integers(0, 151_642), st.integers(151_643, 151_664))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(TOKEN_IDS, max_size=48), skip=st.booleans())
def test_random_ids_join_to_the_full_decode(tokenizer, ids, skip):
    pieces, rest = stream(tokenizer, ids, skip_special_tokens=skip)
    assert_pieces_match(pieces, rest, tokenizer.decode(ids, skip_special_tokens=skip))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8"), max_size=40))
def test_random_text_streams_without_replacement_characters(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.decode(ids, skip_special_tokens=True)  # what the stream emits: special tokens skipped
    pieces, rest = stream(tokenizer, ids)
    assert_pieces_match(pieces, rest, full)
    if REPLACEMENT not in full:
        assert rest == "" and not any(REPLACEMENT in piece for piece in pieces)
