"""Log probabilities from the continuous engine's own logits (pipeline/continuous/sampling.py): one
per generated token, its chosen token's and its top alternatives', changing no token, and
batch-invariant as the tokens are: the same request alone and among 8 others of different lengths,
samplings and log-probability asks, joining at different steps, gets the same records bit for bit,
in every precision."""
from __future__ import annotations

import math

import pytest

from pipeline.continuous.sampling import TokenLogprob
from pipeline.generator import GenerationRequest
from pipeline.sampling_params import Sampling, SamplingError
from tests.helpers import run_joining
from tests.unit.test_sampling import DOCS, NEW, QUERIES

pytestmark = pytest.mark.timeout(600)


def ask(i: int, sampling: Sampling | None, new: int = NEW) -> GenerationRequest:
    return GenerationRequest(QUERIES[i % len(QUERIES)], DOCS[: i % 3], new, sampling=sampling)


def records(engine, requests: list[GenerationRequest], join_every: int = 1) -> list[tuple[list[int], list]]:
    seqs = run_joining(engine, requests, join_every)
    return [(seq.generated, seq.logprobs) for seq in seqs]


def test_a_requests_log_probabilities_are_the_same_alone_and_among_8_bit_for_bit(variant_engine):
    greedy, sampled = ask(1, Sampling(logprobs=5)), ask(2, Sampling(0.8, seed=3, logprobs=2))
    mates = [ask(i, None if i % 3 == 0 else Sampling(0.3 + i / 10, 0.9, 40, seed=100 + i,
                                                     logprobs=None if i % 2 else i),
                 NEW - i % 3) for i in range(3, 9)]
    [greedy_alone], [sampled_alone] = records(variant_engine, [greedy]), records(variant_engine, [sampled])
    together = records(variant_engine, [mates[0], greedy, *mates[1:4], sampled, *mates[4:]], join_every=2)
    assert together[1] == greedy_alone and together[5] == sampled_alone
    assert [len(lp) for lp in (greedy_alone[1], sampled_alone[1])] == [len(greedy_alone[0]), len(sampled_alone[0])]


def test_each_record_is_its_tokens_and_asking_changes_no_token(engine):
    [(plain, none)], [(tokens, logprobs)] = records(engine, [ask(0, None)]), records(engine, [ask(0, Sampling(logprobs=4))])
    assert none is None and tokens == plain and len(logprobs) == len(tokens)
    for token, record in zip(tokens, logprobs):
        assert isinstance(record, TokenLogprob) and record.token == token and record.logprob <= 0
        assert len(record.top) == 4 and [v for _, v in record.top] == sorted((v for _, v in record.top), reverse=True)
        assert record.top[0] == (token, record.logprob)  # greedy: the most likely token is the one chosen
        assert sum(math.exp(v) for _, v in record.top) <= 1 + 1e-5
    [(sampled_tokens, sampled_records)] = records(engine, [ask(0, Sampling(1.5, seed=9, logprobs=0))])
    assert [r.token for r in sampled_records] == sampled_tokens and all(r.top == () for r in sampled_records)


def test_top_logprobs_has_openais_bounds():
    with pytest.raises(SamplingError) as caught:
        Sampling(logprobs=21)
    assert caught.value.field == "top_logprobs"
