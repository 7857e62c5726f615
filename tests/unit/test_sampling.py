"""Sampling in the continuous engine: a request's tokens depend only on its logits and its seed.

As greedy batch invariance is tested (tests/unit/test_precision.py): the same sampled request
alone, then among 8 requests of different lengths, seeds and temperatures joining at different
steps, in every precision, gives the same tokens. Stop strings end the answer and are not in it.
"""
from __future__ import annotations

import pytest

from pipeline.continuous import ContinuousEngine
from pipeline.continuous.output import Finish
from pipeline.continuous.sampling import first_argmax
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest
from pipeline.sampling_params import Sampling, SamplingError
from pipeline.stop_strings import StopStringFilter, first_stop
from tests.helpers import run_joining

DOCS = tuple(Document(i, f"Doc {i}", "Refunds take 5 days." * (i + 1), "billing") for i in range(2))
QUERIES = ("How do I get a refund?", "Where is my order?", "Can I change my plan?")
NEW = 8  # new tokens per answer: enough to show a sampled answer differs from greedy


def sampled(seed: int, temperature: float = 0.9, **kw) -> Sampling:
    return Sampling(temperature=temperature, seed=seed, **kw)


# ----------------------------------------------------------------------------- parameters and stop strings

def test_a_sampled_request_needs_its_seed_and_each_field_its_rule():
    assert Sampling(0.7, 0.9, 40, 123, ("END",)).seed == 123
    for kwargs, field in (({"temperature": 0.5}, "seed"), ({"temperature": 3, "seed": 1}, "temperature"),
                          ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"stop": ("a",) * 5}, "stop"),
                          ({"stop": ("",)}, "stop")):
        with pytest.raises(SamplingError) as caught:
            Sampling(**kwargs)
        assert caught.value.field == field


@pytest.mark.parametrize("pieces", [["Hello wor", "ld. EN", "D and more"], ["H", "ello", " E", "N", "D"],
                                    ["Hello E", "ND"], ["Hello EN", "d then END"]])
def test_stop_filter_never_shows_a_stop_string_and_joins_to_the_truncated_text(pieces):
    stops = ["END", "\n\n"]
    text = "".join(pieces)
    f = StopStringFilter(stops)
    shown = []
    for piece in pieces:
        shown.append(f.push(piece))
        assert "END" not in "".join(shown)
    assert "".join(shown) + f.finish() == text[:first_stop(text, stops)]


def test_stop_filter_releases_a_held_tail_that_never_became_a_stop_string():
    f = StopStringFilter(["ENDING"])
    assert f.push("the END") == "the "
    assert f.push("!") == "END!"
    assert f.push(" ok EN") == " ok "
    assert f.finish() == "EN" and not f.stopped


# ----------------------------------------------------------------------------- engine, every precision
# Kept cheap: one engine per precision for all its cases (tests/unit/conftest.py), short prompts, NEW tokens per answer.


def run(engine: ContinuousEngine, requests: list[GenerationRequest], join_every: int = 1) -> list[list[int]]:
    """Each request's tokens, the requests joining `join_every` steps apart."""
    seqs = run_joining(engine, requests, join_every)
    assert not engine.runner.table.rows  # every slot, its random stream with it, left with its sequence
    return [seq.generated for seq in seqs]


def ask(i: int, sampling: Sampling | None, new: int = NEW) -> GenerationRequest:
    return GenerationRequest(QUERIES[i % len(QUERIES)], DOCS[: i % 3], new, sampling=sampling)


def test_a_seeded_request_gets_the_same_tokens_alone_and_among_8_and_greedy_is_unchanged(variant_engine):
    target, greedy = ask(1, sampled(seed=7)), ask(0, None)
    mates = [ask(i, None if i % 3 == 0 else sampled(seed=100 + i, temperature=0.3 + i / 10, top_p=0.9, top_k=50),
                 NEW - i % 3) for i in range(2, 8)]
    [alone], [greedy_alone] = run(variant_engine, [target]), run(variant_engine, [greedy])
    together = run(variant_engine, [greedy, *mates[:3], target, *mates[3:]])
    assert len(together) == 8 and together[4] == alone and together[0] == greedy_alone


def test_the_seed_is_the_stream_and_greedy_ignores_it(engine):
    seven, eight, greedy, greedy_seeded = run(engine, [ask(1, sampled(seed=7)), ask(1, sampled(seed=8)),
                                                       ask(1, None), ask(1, Sampling(seed=5))])
    assert seven != eight and seven != greedy
    assert greedy_seeded == greedy


def test_a_stop_string_ends_the_answer_is_not_in_it_and_its_output_side_cancels_the_sequence(engine):
    [seq_tokens] = run(engine, [ask(0, None, 16)])
    full = engine.generator.completion(seq_tokens).text
    stop = full[len(full) // 2: len(full) // 2 + 3]  # three characters from the middle of the greedy answer
    assert stop.strip(), full
    stops = (stop, "never-there")
    stopped = engine.add(ask(0, Sampling(stop=stops), 16))
    output = engine.generator.output(stops, abort=lambda: engine.cancel(stopped))
    while engine.has_work():
        for _seq, token in engine.step().tokens:
            output.push(token)
    output.finish(Finish.ABORTED)
    assert (output.text, output.finish_reason) == (full[:full.index(stop)], "stop")
    assert len(stopped.generated) == output.token_count < len(seq_tokens)  # no step after the stop


def test_the_engine_never_decodes(generator, monkeypatch):
    engine = ContinuousEngine(generator, max_batch=8, kv_cache_tokens=8192, prefill_chunk=64)

    def refuse(*args, **kwargs):
        raise AssertionError("the engine decoded")

    monkeypatch.setattr(generator.tokens, "decode", refuse)
    seqs = [engine.add(GenerationRequest(query, DOCS[:n], 6, sampling=Sampling(stop=(" ", "e"))))  # stops in every answer
            for query in QUERIES for n in range(len(DOCS) + 1)]
    while engine.has_work():
        assert not engine.step().failed
    # Stop strings are the output side's: each sequence ran to its cap or to an end-of-turn token.
    ends = [(len(seq.generated), seq.generated[-1] in engine.eos_ids) for seq in seqs]
    assert all(length == 6 or (length < 6 and eos) for length, eos in ends), ends
    assert any(length == 6 for length, _ in ends), ends  # one answer at least had room for its stop strings


@pytest.mark.parametrize("vocab", [151_936, 151_665, 4096, 2049, 1009, 7])
def test_the_greedy_token_is_torchs_argmax_with_ties_nans_and_infinities(vocab):
    import torch
    stream = torch.Generator().manual_seed(vocab)
    for trial in range(24):
        rows = 1 + trial % 9
        x = torch.randn(rows, vocab, generator=stream)
        if trial % 3 == 0:
            x = x.round()  # many ties: the first largest wins
        if trial % 4 == 1:
            x[0, int(torch.randint(0, vocab, (1,), generator=stream))] = float("nan")  # the first NaN wins
            x[-1, -1] = float("nan")
        if trial % 6 == 2:
            x[0] = float("-inf")
            x[-1, vocab // 2:] = float("inf")
        if trial % 8 == 3:
            x[0] = 1.0
        assert torch.equal(first_argmax(x), x.argmax(dim=-1)), f"vocab {vocab}, trial {trial}"
    assert torch.equal(first_argmax(x[:, ::2]), x[:, ::2].argmax(dim=-1))  # not contiguous: torch's own


def test_a_seeded_request_still_prefilling_in_a_slot_below_decoding_rows_gets_its_tokens_as_alone(generator):
    # A finishes early and its slot takes the last row, the seeded one, still prefilling its long prompt
    # (chunks of 8 tokens): the decode steps then run that slot below a decoding one; its random
    # stream must not be drawn from before its own first token.
    engine = ContinuousEngine(generator, max_batch=3, kv_cache_tokens=4096, prefill_chunk=8)
    target = GenerationRequest(QUERIES[2], DOCS, NEW, sampling=sampled(seed=11))
    [alone] = run(engine, [target])
    seqs = [engine.add(ask(0, None, 2)), engine.add(ask(1, None, 3 * NEW))]
    while not all(engine.runner.table.rows[s].decoding for s in range(2) if s < len(engine.runner.table.rows)):
        assert not engine.step().failed
    seqs.append(engine.add(target))
    idle_below_decoding = 0
    while engine.has_work():
        rows = engine.runner.table.rows
        decoding = [s for s, row in enumerate(rows) if row.decoding]
        idle_below_decoding += any(not row.decoding and s < max(decoding, default=-1) for s, row in enumerate(rows))
        assert not engine.step().failed
    assert idle_below_decoding > 0  # the layout this test is about did occur
    assert seqs[2].generated == alone
