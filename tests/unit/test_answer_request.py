"""services/server/answer_request.py: the one request object and the one parser of it; its decoding
fields (temperature, top_p, top_k, seed and stop) as /v1 sends them and a worker reads them back
from `wire()`."""
from __future__ import annotations

import pytest
from flask import Flask

from pipeline import spec
from pipeline.config import Settings
from pipeline.conversation import Conversation, Turn
from pipeline.sampling_params import Sampling
from services.server.answer_request import ALL_FIELDS, AnswerRequest, Bounds, read_request
from services.server.errors import ApiError

BOUNDS = Bounds(Settings.from_env({"MAX_QUERY_TOKENS": "16", "MAX_REQUEST_ID_CHARS": "8"}).limits, len)


def read(body: dict, *accepted: str) -> AnswerRequest:
    with Flask("t").test_request_context():
        return read_request(body, BOUNDS, accepted) if accepted else read_request(body, BOUNDS)


def test_a_body_is_one_request_and_a_field_the_route_does_not_offer_or_know_is_refused_by_name():
    body = {"request_id": "r1", "query": "Refund?", "max_new_tokens": 5, "stream": True}
    assert read(body) == AnswerRequest("r1", "Refund?", max_new_tokens=5, stream=True)
    for extra, *accepted in ((body, "request_id", "query", "stream"), ({**body, "other": 1},)):
        with pytest.raises(ApiError) as err:
            read(extra, *accepted)
        refused = "max_new_tokens" if accepted else "other"
        assert (err.value.status, err.value.field, err.value.code) == (400, refused, "unsupported_parameter")
        assert f"'{refused}' is not supported" in err.value.message
    with Flask("t").test_request_context():  # what the route reads itself is no stranger
        assert read_request({**body, "timeout_s": 3}, BOUNDS, also=("timeout_s",)).request_id == "r1"


@pytest.mark.parametrize("change,field,message", [
    ({"request_id": None}, "request_id", "'request_id' is required"),
    ({"request_id": "123456789"}, "request_id", "'request_id' is 9 characters; the limit is 8"),
    ({"query": 7}, "query", "'query' must be a string, got int"),
    ({"query": "x" * 17}, "query", "'query' is 17 tokens; the limit is 16 tokens (MAX_QUERY_TOKENS"),
    ({"max_new_tokens": 0}, "max_new_tokens", f"'max_new_tokens' must be an integer from 1 to {spec.MAX_NEW_TOKENS}"),
    ({"max_new_tokens": True}, "max_new_tokens", "'max_new_tokens' must be an integer"),
    ({"stream": "yes"}, "stream", "'stream' must be true or false"),
])
def test_each_refusal_names_the_field_and_the_rule(change, field, message):
    with pytest.raises(ApiError) as err:
        read({"request_id": "r1", "query": "Refund?", **change})
    assert (err.value.status, err.value.field) == (400, field) and message in err.value.message


def test_a_worker_is_sent_the_fields_not_at_their_default():
    assert AnswerRequest("r1", "q").wire() == {"request_id": "r1", "query": "q"}
    assert AnswerRequest("r1", "q", max_new_tokens=4).wire() == {"request_id": "r1", "query": "q", "max_new_tokens": 4}
    with Flask("t").test_request_context():  # what is sent reads back as the same request
        request = AnswerRequest("r1", "q", max_new_tokens=4, stream=True)
        assert read_request(request.wire(), BOUNDS) == request


# ----------------------------------------------------------------------------- the decoding fields

DEFAULT_BOUNDS = Bounds(Settings.from_env({}).limits, len, max_new_tokens=512)
ASK = {"request_id": "r", "query": "How do I return it?"}


@pytest.fixture
def request_context():
    with Flask("t").test_request_context():  # the rules bind the request_id to the request
        yield


def read_fields(bounds: Bounds = DEFAULT_BOUNDS, **fields) -> AnswerRequest:
    return read_request({**ASK, **fields}, bounds)


@pytest.mark.usefixtures("request_context")
def test_greedy_by_default_and_the_questions_answer():
    request = read_fields()
    assert not request.sampled and request.is_the_questions_answer and request.sampling(drawn_seed=1) is None
    assert read_fields(temperature=None, seed=None, top_k=None, stop=None) == request
    assert not read_fields(stop="END").is_the_questions_answer and not read_fields(max_new_tokens=5).is_the_questions_answer


@pytest.mark.usefixtures("request_context")
def test_the_fields_as_sent_and_as_the_worker_reads_them_back():
    request = read_fields(temperature=0.8, top_p=0.9, top_k=40, seed=3, stop=["\n\n", "END"], max_new_tokens=512)
    assert request.sampling(drawn_seed=99) == Sampling(0.8, 0.9, 40, 3, ("\n\n", "END"))
    assert read_request(request.wire(), DEFAULT_BOUNDS) == request  # what node 1 gets is what node 0 read
    assert not request.is_the_questions_answer


@pytest.mark.usefixtures("request_context")
def test_a_sampled_request_without_a_seed_takes_the_drawn_one():
    request = read_fields(temperature=1.0)
    assert request.seed is None and request.sampling(drawn_seed=42) == Sampling(1.0, 1.0, 0, 42, ())
    assert read_fields(stop="x").sampling(drawn_seed=42) == Sampling(stop=("x",))  # greedy: no seed needed


@pytest.mark.usefixtures("request_context")
def test_query_refuses_the_decoding_fields_by_name():
    with pytest.raises(ApiError) as info:  # /query's answer is the contract's: a decoding field is not ignored
        read_request({**ASK, "temperature": 0.9}, DEFAULT_BOUNDS, ("request_id", "query", "stream"))
    assert (info.value.status, info.value.field) == (400, "temperature")
    assert read_request(ASK, DEFAULT_BOUNDS, ("request_id", "query", "stream")).is_the_questions_answer


@pytest.mark.parametrize("fields, field", [
    ({"temperature": 2.5}, "temperature"), ({"temperature": "0"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": 1.5}, "top_k"), ({"top_k": -2}, "top_k"),
    ({"seed": "7"}, "seed"), ({"seed": 2**64}, "seed"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"), ({"stop": [""]}, "stop"), ({"max_new_tokens": 513}, "max_new_tokens"),
])
@pytest.mark.usefixtures("request_context")
def test_a_field_out_of_its_rule_is_a_400_naming_it(fields, field):
    with pytest.raises(ApiError) as info:
        read_fields(**fields)
    assert info.value.status == 400 and info.value.field == field


@pytest.mark.usefixtures("request_context")
def test_a_workers_bounds_accept_sampling_and_cap_new_tokens_at_the_openai_cap():
    from services.roles.worker.role import worker_bounds
    bounds = worker_bounds(Settings.from_env({"OPENAI_MAX_TOKENS_CAP": "64"}), len)
    assert read_fields(bounds, temperature=0.5, seed=1, stop="x").sampling(drawn_seed=2) == Sampling(0.5, 1.0, 0, 1, ("x",))
    assert read_fields(bounds, max_new_tokens=64).max_new_tokens == 64
    with pytest.raises(ApiError) as info:
        read_fields(bounds, max_new_tokens=65)
    assert info.value.field == "max_new_tokens"
    assert set(ALL_FIELDS) >= {"temperature", "top_p", "top_k", "seed", "stop"}


# ----------------------------------------------------------------------------- a conversation

HISTORY = [{"role": "user", "content": "My order hasn't arrived."}, {"role": "assistant", "content": "Its number?"}]


@pytest.mark.usefixtures("request_context")
def test_a_history_is_read_as_turns_and_sent_on_as_it_came():
    request = read_fields(history=HISTORY, instructions="Be brief.")
    assert request.history == (Turn("user", "My order hasn't arrived."), Turn("assistant", "Its number?"))
    assert request.conversation == Conversation(request.history, "Be brief.")
    assert request.wire()["history"] == HISTORY
    assert read_request(request.wire(), DEFAULT_BOUNDS) == request  # what node 1 gets is what node 0 read
    assert read_fields(history=[]) == read_fields(history=None) == read_fields()
    assert "history" not in read_fields().wire() and read_fields(history=[]).conversation_key == ""
    # /query takes a history, not instructions (those are the chat's system messages).
    assert read_request({**ASK, "history": HISTORY}, DEFAULT_BOUNDS, ("request_id", "query", "history")).history
    with pytest.raises(ApiError) as info:
        read_request({**ASK, "instructions": "x"}, DEFAULT_BOUNDS, ("request_id", "query", "history"))
    assert info.value.field == "instructions"


@pytest.mark.parametrize("history, field, rule", [
    ("hi", "history", "must be an array of turns"),
    ([["user", "hi"]], "history[0]", "must be an object"),
    ([{"role": "system", "content": "hi"}], "history[0].role", "must be one of user, assistant"),
    ([{"content": "hi"}], "history[0].role", "must be one of user, assistant"),
    ([HISTORY[0], {"role": "assistant", "content": None}], "history[1].content", "must be a string"),
    ([HISTORY[0], {"role": "assistant", "content": ["a"]}], "history[1].content", "must be a string"),
    ([{"role": "user", "content": "hi", "name": "ann"}], "history[0].name", "is not a field of a turn"),
    ([{"role": "user", "content": "hi \ud800"}], "history[0].content", "lone surrogate"),
])
@pytest.mark.usefixtures("request_context")
def test_a_history_out_of_its_rule_is_a_400_naming_the_turn_and_the_rule(history, field, rule):
    with pytest.raises(ApiError) as info:
        read_fields(history=history)
    assert (info.value.status, info.value.field) == (400, field) and rule in info.value.message


@pytest.mark.usefixtures("request_context")
def test_the_instructions_are_bounded_in_tokens_by_max_history_tokens():
    bounds = Bounds(Settings.from_env({"MAX_HISTORY_TOKENS": "8"}).limits, lambda text: len(text.split()))
    assert read_fields(bounds, instructions="one two three four five six seven eight").instructions
    with pytest.raises(ApiError) as info:
        read_fields(bounds, instructions="one two three four five six seven eight nine")
    assert info.value.field == "instructions" and "9 tokens; the limit is 8 tokens (MAX_HISTORY_TOKENS" in \
        info.value.message


@pytest.mark.usefixtures("request_context")
def test_the_conversation_key_covers_every_turn_and_the_instructions():
    base = read_fields(history=HISTORY)
    keys = {base.conversation_key, read_fields().conversation_key,
            read_fields(history=HISTORY[:1]).conversation_key,
            read_fields(history=[HISTORY[0], {"role": "assistant", "content": "Its number!"}]).conversation_key,
            read_fields(history=HISTORY, instructions="Be brief.").conversation_key,
            read_fields(history=[{"role": "assistant", "content": HISTORY[0]["content"]}, HISTORY[1]]).conversation_key}
    assert len(keys) == 6
    assert read_fields(history=HISTORY).conversation_key == base.conversation_key  # the same conversation


def test_logprobs_asks_the_engine_for_them_travels_to_the_worker_and_is_never_the_cached_answer():
    asked = read({"request_id": "lp", "query": "q", "logprobs": 5})
    assert asked.logprobs == 5 and not asked.is_the_questions_answer and asked.wire()["logprobs"] == 5
    assert asked.sampling(drawn_seed=1) == Sampling(logprobs=5)  # greedy, with log probabilities
    assert read({"request_id": "lp", "query": "q"}).sampling(drawn_seed=1) is None
    for value in (21, -1, True, "3"):
        with pytest.raises(ApiError) as caught:
            read({"request_id": "lp", "query": "q", "logprobs": value})
        assert caught.value.field == "logprobs"


def test_parallel_tool_calls_false_travels_to_the_worker_and_is_never_the_cached_answer():
    one = read({"request_id": "p", "query": "q", "parallel_tool_calls": False})
    assert not one.parallel_tool_calls and not one.is_the_questions_answer and one.wire()["parallel_tool_calls"] is False
    assert read({"request_id": "p", "query": "q", "parallel_tool_calls": None}).parallel_tool_calls
    with pytest.raises(ApiError) as caught:
        read({"request_id": "p", "query": "q", "parallel_tool_calls": "no"})
    assert caught.value.field == "parallel_tool_calls"
