"""The decoding fields of a request (services/server/answer_request.py's rules): temperature, top_p,
top_k, seed and stop, as /v1 sends them and a worker reads them back from `wire()`."""
from __future__ import annotations

import pytest
from flask import Flask

from pipeline.config import Settings
from pipeline.sampling_params import Sampling
from services.server.answer_request import ALL_FIELDS, AnswerRequest, Bounds, read_request
from services.server.errors import ApiError

LIMITS = Settings.from_env({}).limits
BOUNDS = Bounds(LIMITS, len, max_new_tokens=512)
ASK = {"request_id": "r", "query": "How do I return it?"}


@pytest.fixture(autouse=True)
def request_context():
    with Flask("t").test_request_context():  # the rules bind the request_id to the request
        yield


def read(bounds: Bounds = BOUNDS, **fields) -> AnswerRequest:
    return read_request({**ASK, **fields}, bounds)


def test_greedy_by_default_and_the_questions_answer():
    request = read()
    assert not request.sampled and request.is_the_questions_answer and request.sampling(drawn_seed=1) is None
    assert read(temperature=None, seed=None, top_k=None, stop=None) == request
    assert not read(stop="END").is_the_questions_answer and not read(max_new_tokens=5).is_the_questions_answer


def test_the_fields_as_sent_and_as_the_worker_reads_them_back():
    request = read(temperature=0.8, top_p=0.9, top_k=40, seed=3, stop=["\n\n", "END"], max_new_tokens=512)
    assert request.sampling(drawn_seed=99) == Sampling(0.8, 0.9, 40, 3, ("\n\n", "END"))
    assert read_request(request.wire(), BOUNDS) == request  # what node 1 gets is what node 0 read
    assert not request.is_the_questions_answer


def test_a_sampled_request_without_a_seed_takes_the_drawn_one():
    request = read(temperature=1.0)
    assert request.seed is None and request.sampling(drawn_seed=42) == Sampling(1.0, 1.0, 0, 42, ())
    assert read(stop="x").sampling(drawn_seed=42) == Sampling(stop=("x",))  # greedy: no seed needed


def test_query_refuses_the_decoding_fields_by_name():
    with pytest.raises(ApiError) as info:  # /query's answer is the contract's: a decoding field is not ignored
        read_request({**ASK, "temperature": 0.9}, BOUNDS, ("request_id", "query", "stream"))
    assert (info.value.status, info.value.field) == (400, "temperature")
    assert read_request(ASK, BOUNDS, ("request_id", "query", "stream")).is_the_questions_answer


@pytest.mark.parametrize("fields, field", [
    ({"temperature": 2.5}, "temperature"), ({"temperature": "0"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": 1.5}, "top_k"), ({"top_k": -2}, "top_k"),
    ({"seed": "7"}, "seed"), ({"seed": 2**64}, "seed"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"), ({"stop": [""]}, "stop"), ({"max_new_tokens": 513}, "max_new_tokens"),
])
def test_a_field_out_of_its_rule_is_a_400_naming_it(fields, field):
    with pytest.raises(ApiError) as info:
        read(**fields)
    assert info.value.status == 400 and info.value.field == field


def test_a_workers_bounds_accept_sampling_and_cap_new_tokens_at_the_openai_cap():
    from services.roles.worker.role import worker_bounds
    bounds = worker_bounds(Settings.from_env({"OPENAI_MAX_TOKENS_CAP": "64"}), len)
    assert read(bounds, temperature=0.5, seed=1, stop="x").sampling(drawn_seed=2) == Sampling(0.5, 1.0, 0, 1, ("x",))
    assert read(bounds, max_new_tokens=64).max_new_tokens == 64
    with pytest.raises(ApiError) as info:
        read(bounds, max_new_tokens=65)
    assert info.value.field == "max_new_tokens"
    assert set(ALL_FIELDS) >= {"temperature", "top_p", "top_k", "seed", "stop"}
