"""Sampling in the continuous engine: a request's tokens depend only on its logits and its seed.

As greedy batch invariance is tested (tests/unit/test_precision.py): the same sampled request
alone, then among 8 requests of different lengths, seeds and temperatures joining at different
steps, in every precision, gives the same tokens. Stop strings end the answer and are not in it.
"""
from __future__ import annotations

import pytest

from pipeline import spec
from pipeline.continuous import ContinuousEngine
from pipeline.device import Placement
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest, Generator
from pipeline.precision import LOAD_DTYPE
from pipeline.sampling_params import Sampling, SamplingError
from pipeline.stop_strings import StopStringFilter, truncate

DOCS = tuple(Document(i, f"Document {i}", "Refunds are issued within 5 days. " * (i + 1), "billing")
             for i in range(3))
NEW = 24  # new tokens per answer: enough to show a sampled answer differs from greedy


def sampled(seed: int, temperature: float = 0.9, **kw) -> Sampling:
    return Sampling(temperature=temperature, seed=seed, **kw)


# ----------------------------------------------------------------------------- parameters and stop strings

def test_sampling_params_cross_nodes_as_json_and_refuse_what_breaks_a_rule():
    s = Sampling(0.7, 0.9, 40, 123, ("\n\n", "END"))
    assert Sampling.from_json(s.to_json()) == s
    for body, field in (({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
                        ({"temperature": 0.5}, "seed"), ({"stop": ["a"] * 5}, "stop"), ({"stop": [""]}, "stop"),
                        ({"seed": "1"}, "seed"), ({"temperature": "hot"}, "temperature")):
        with pytest.raises(SamplingError) as caught:
            Sampling.from_json(body)
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
    assert "".join(shown) + f.finish() == truncate(text, stops)


def test_stop_filter_releases_a_held_tail_that_never_became_a_stop_string():
    f = StopStringFilter(["ENDING"])
    assert f.push("the END") == "the "
    assert f.push("!") == "END!"
    assert f.push(" ok EN") == " ok "
    assert f.finish() == "EN" and not f.stopped


# ----------------------------------------------------------------------------- engine, every precision

@pytest.fixture(scope="module", params=("float32", "bfloat16", "int8-dynamic", "int8-weight"))
def variant_generator(request, model_source):
    return Generator.load(model_source, Placement("cpu", LOAD_DTYPE[request.param], request.param))


def run(generator, requests: list[GenerationRequest], join_every: int = 3) -> list[list[int]]:
    """Each request's tokens, the requests joining `join_every` steps apart."""
    engine = ContinuousEngine(generator, max_seqs=8, max_tokens=8192, prefill_chunk=32)
    seqs, pending, step = {}, list(enumerate(requests)), 0
    while pending or engine.has_work():
        if pending and step % join_every == 0:
            i, request = pending.pop(0)
            seqs[i] = engine.add(request)
        assert not engine.step().failed
        step += 1
    assert not engine.runner.chooser._streams  # every stream left with its sequence
    return [seqs[i].generated for i in range(len(requests))]


def test_a_seeded_request_gets_the_same_tokens_alone_and_among_8(variant_generator):
    queries = spec.REFERENCE_QUERIES
    target = GenerationRequest(queries[1], DOCS[:2], NEW, sampling=sampled(seed=7))
    mates = [GenerationRequest(queries[i % len(queries)], DOCS[: i % 4], NEW - i,
                               sampling=None if i % 3 == 0 else sampled(seed=100 + i, temperature=0.3 + i / 10,
                                                                        top_p=0.9, top_k=50))
             for i in range(7)]
    [alone] = run(variant_generator, [target])
    assert run(variant_generator, mates[:3] + [target] + mates[3:], join_every=1)[3] == alone


def test_the_seed_is_the_stream_and_greedy_ignores_it(generator):
    query = spec.REFERENCE_QUERIES[1]
    seven, eight, greedy, greedy_seeded = run(generator, [
        GenerationRequest(query, DOCS[:2], NEW, sampling=sampled(seed=7)),
        GenerationRequest(query, DOCS[:2], NEW, sampling=sampled(seed=8)),
        GenerationRequest(query, DOCS[:2], NEW), GenerationRequest(query, DOCS[:2], NEW, sampling=Sampling(seed=5))])
    assert seven != eight and seven != greedy
    assert greedy_seeded == greedy


def test_a_stop_string_ends_the_answer_and_is_not_in_it(generator):
    request = GenerationRequest(spec.REFERENCE_QUERIES[0], DOCS[:1], NEW)
    engine = ContinuousEngine(generator, max_seqs=2, max_tokens=8192, prefill_chunk=32)
    seq = engine.add(request)
    while engine.has_work():
        engine.step()
    full = engine.text(seq)
    stop = full[len(full) // 2: len(full) // 2 + 3]  # three characters from the middle of the greedy answer
    assert stop.strip(), full
    stopped = engine.add(GenerationRequest(request.query, request.documents, NEW,
                                           sampling=Sampling(stop=(stop, "never-there"))))
    while engine.has_work():
        engine.step()
    assert engine.text(stopped) == full[:full.index(stop)]
    assert len(stopped.generated) < len(seq.generated)
