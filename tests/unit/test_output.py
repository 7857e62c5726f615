"""pipeline/continuous/output.py on the stand-in Qwen2.5 tokenizer: one sequence's token ids in, its
pieces, text and finish reason out, as the worker streams them and the reference cuts them."""
from __future__ import annotations

import pytest

from pipeline import spec
from pipeline.continuous.output import Finish, OutputProcessor, complete, finish_of
from pipeline.detokenize import REPLACEMENT

EOS = 151645  # <|im_end|>: a special token, skipped in the text


@pytest.fixture(scope="module")
def tokenizer(model_source):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, **model_source.hf_kwargs())


def run(tokenizer, ids, finish, stops=()) -> tuple[OutputProcessor, list[str], int]:
    """The processor fed `ids`, then `finish`: it, its pieces (the rest last) and how often it aborted."""
    aborts: list[None] = []
    output = OutputProcessor(tokenizer, stops, abort=lambda: aborts.append(None))
    pieces = [output.push(i) for i in ids]
    pieces.append(output.finish(finish))
    return output, pieces, len(aborts)


def token_texts(tokenizer, text) -> tuple[list[int], list[str]]:
    """An ASCII text's ids and each id's own text (which, for ASCII, join to the text)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = [tokenizer.decode([i]) for i in ids]
    assert "".join(texts) == text
    return ids, texts


def test_multi_byte_characters_split_across_tokens_come_out_whole(tokenizer):
    text = "Emoji 😀👍🏽 and 中文 then café"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)  # some token holds part of a character
    output, pieces, aborts = run(tokenizer, ids, Finish.LENGTH)
    assert "".join(pieces) == output.text == text and not any(REPLACEMENT in p for p in pieces)
    assert (output.finish_reason, output.token_count, aborts) == ("length", len(ids), 0)


def test_a_stop_string_spanning_tokens_ends_the_answer_before_it_and_aborts_once(tokenizer):
    text = "Answer: return it within thirty days. Thanks for asking, goodbye."
    ids, texts = token_texts(tokenizer, text)
    stop = "Thanks for"
    ends = [len("".join(texts[:n + 1])) for n in range(len(texts))]
    starts_in = next(n for n, end in enumerate(ends) if end > text.index(stop))
    completed_by = next(n for n, end in enumerate(ends) if end >= text.index(stop) + len(stop))
    assert completed_by > starts_in  # it spans tokens
    output, pieces, aborts = run(tokenizer, ids, Finish.ABORTED, stops=(stop, "never"))
    assert output.text == "".join(pieces) == text[:text.index(stop)]  # no part of it ever shows
    assert (output.finish_reason, output.token_count, aborts) == ("stop", completed_by + 1, 1)


def test_a_stop_string_that_starts_a_piece(tokenizer):
    text = "Hello there, friend of mine"
    ids, texts = token_texts(tokenizer, text)
    k = next(n for n in range(1, len(texts)) if len(texts[n]) > 2)
    stop = texts[k]  # exactly one token's text: it starts where that token's piece would
    assert text.index(stop) == len("".join(texts[:k]))
    output, pieces, aborts = run(tokenizer, ids, Finish.ABORTED, stops=(stop,))
    assert output.text == "".join(texts[:k]) and pieces[k] == "" and aborts == 1
    assert output.finish_reason == "stop" and output.token_count == k + 1
    first, _, _ = run(tokenizer, ids, Finish.ABORTED, stops=(texts[0],))  # at the very first token
    assert (first.text, first.finish_reason, first.token_count) == ("", "stop", 1)


def test_a_stop_string_completed_by_the_last_allowed_token_is_stop_not_length(tokenizer):
    text = "Answer: return it within thirty days"
    ids, texts = token_texts(tokenizer, text)
    output, pieces, aborts = run(tokenizer, ids, Finish.LENGTH, stops=(texts[-2] + texts[-1],))
    assert output.text == "".join(texts[:-2]) and output.finish_reason == "stop" and aborts == 1
    plain, _, _ = run(tokenizer, ids, Finish.LENGTH, stops=("never",))
    assert (plain.text, plain.finish_reason) == (text, "length")


def test_eos_on_the_last_allowed_token_is_stop_and_its_text_is_skipped(tokenizer):
    ids, _ = token_texts(tokenizer, "Answer: within thirty days")
    output, pieces, aborts = run(tokenizer, [*ids, EOS], finish_of([*ids, EOS], frozenset({EOS})))
    assert (output.text, output.finish_reason, output.token_count, aborts) == ("Answer: within thirty days", "stop",
                                                                               len(ids) + 1, 0)
    assert finish_of(ids, frozenset({EOS})) is Finish.LENGTH


def test_tokens_after_the_stop_are_not_the_answers_and_a_whole_sequence_gives_the_same_answer(tokenizer):
    text = "one two three four five six"
    ids, texts = token_texts(tokenizer, text)
    streamed, pieces, _ = run(tokenizer, ids, Finish.LENGTH, stops=(" three",))
    assert all(p == "" for p in pieces[3:])
    assert complete(tokenizer, ids, Finish.LENGTH, (" three",)) == streamed.completion()
    assert streamed.completion().text == "one two" and streamed.completion().token_count == 3


def test_an_abort_without_a_stop_string_has_no_answer_and_finish_is_once(tokenizer):
    output = OutputProcessor(tokenizer, ("hi!",))
    assert output.push(tokenizer.encode("hi")[0]) == ""  # it may still become the stop string
    with pytest.raises(ValueError):
        output.finish(Finish.ABORTED)
    assert output.finish(Finish.EOS) == "hi" and output.push(5) == "" and output.text == "hi"
    with pytest.raises(RuntimeError):
        output.finish(Finish.EOS)
