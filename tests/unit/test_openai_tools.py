"""Tools on the OpenAI route, without a model: a chat's tool round and tool messages read into the
service's request (and sent on to a worker as they were read), `tool_choice` honoured by what the
model is shown or refused by name, and a reply's tool calls in OpenAI's shapes, checked with the real
`openai` package's types (its stream accumulated as a client does)."""
from __future__ import annotations

import json

import pytest
from flask import Flask

from pipeline.config import Settings
from pipeline.conversation import Turn
from pipeline.tool_calls import ToolCall
from services.roles.gateway import openai_api as api
from services.roles.gateway import openai_responses as out
from services.roles.gateway.openai_api import parse_chat_request
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.answer_request import AnswerRequest, Bounds, read_request
from services.server.errors import ApiError

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TOOL = {"type": "function", "function": {"name": "get_order_status", "description": "An order's status",
                                         "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
OTHER = {"type": "function", "function": {"name": "refund", "parameters": {"type": "object", "properties": {}}}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_order_status", "arguments": '{"id": "ABC123"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'}
REPLY = {"request_id": "r-1", "generated_response": "\n", "sentiment": "neutral", "is_toxic": "false",
         "finish_reason": "tool_calls", "usage": {"prompt_tokens": 300, "completion_tokens": 20},
         "tool_calls": [{"name": "get_order_status", "arguments": '{"id": "ABC123"}'},
                        {"name": "refund", "arguments": "{}"}]}


def parse(**fields) -> api.V1Request:
    return parse_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "Where is ABC123?"}],
                               **fields}, max_tokens_limit=128, model_id=MODEL)


def refused(**fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value


def read(body: dict, limit: str = "1024") -> AnswerRequest:
    bounds = Bounds(Settings.from_env({"MAX_HISTORY_TOKENS": limit}).limits, lambda text: len(text.split()))
    with Flask("t").test_request_context():
        return read_request({"request_id": "r", "query": "Where is ABC123?", **body}, bounds)


# ---------------------------------------------------------------- requests

def test_a_tool_round_after_the_question_follows_it_and_the_question_is_the_latest_user_message():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Where is ABC123?"}, CALLED, RESULT]
    request = parse(messages=messages, tools=[TOOL])
    assert request.query == "Where is ABC123?"
    assert request.history == ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})
    call = {"name": "get_order_status", "arguments": '{"id": "ABC123"}'}
    assert request.tool_round == ({"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "content": '{"status": "shipped"}'})
    assert request.tools == (TOOL,)
    # An earlier round, before a later question, is history.
    later = parse(messages=[*messages, {"role": "user", "content": "Thanks, and a refund?"}], tools=[TOOL])
    assert later.query == "Thanks, and a refund?" and later.tool_round == ()
    assert later.history[2]["content"] == "Where is ABC123?" and later.history[3:] == request.tool_round


def test_tool_choice_is_honoured_by_the_tools_shown():
    assert parse(tools=[TOOL, OTHER]).tools == parse(tools=[TOOL, OTHER], tool_choice="auto").tools == (TOOL, OTHER)
    assert parse(tools=[TOOL, OTHER], tool_choice="none").tools == ()
    named = {"type": "function", "function": {"name": "refund"}}
    assert parse(tools=[TOOL, OTHER], tool_choice=named).tools == (OTHER,)


@pytest.mark.parametrize("fields, rule", [
    ({"tools": [TOOL], "tool_choice": "required"}, "not supported"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "refund"}}}, "not among 'tools'"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "must be 'auto', 'none' or"),
    ({"tool_choice": {"type": "function", "function": {"name": "refund"}}}, "not among 'tools'"),
])
def test_a_tool_choice_that_cannot_be_honoured_is_a_400_naming_it(fields, rule):
    error = refused(**fields)
    assert error.field == "tool_choice" and rule in error.message


def test_a_request_with_tools_is_sent_to_a_worker_as_it_was_read():
    request = read({"tools": [TOOL], "history": [{"role": "user", "content": "Hi"},
                                                 {"role": "assistant", "content": "",
                                                  "tool_calls": [{"name": "refund", "arguments": "{}"}]},
                                                 {"role": "tool", "content": "done"}],
                    "tool_round": [{"role": "assistant", "content": "",
                                    "tool_calls": [{"name": "get_order_status", "arguments": '{"id": "A"}'}]},
                                   {"role": "tool", "content": "shipped"}]})
    assert request.history[1] == Turn("assistant", "", (ToolCall("refund", "{}"),))
    assert request.conversation.tools == (TOOL,) and len(request.conversation.tool_round) == 2
    with Flask("t").test_request_context():
        again = read_request(request.wire(), Bounds(Settings.from_env({}).limits, lambda text: len(text.split())))
    assert again == request
    # The reply cache's key covers the tools and the round.
    keys = {request.conversation_key, read({"tools": [TOOL]}).conversation_key, read({}).conversation_key,
            read({"tools": [OTHER]}).conversation_key}
    assert len(keys) == 4 and read({}).conversation_key == ""


@pytest.mark.parametrize("body, field", [
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"tool_round": [{"role": "user", "content": "x"}]}, "tool_round[0].role"),
    ({"tool_round": [{"role": "tool", "content": "x", "tool_calls": []}]}, "tool_round[0].tool_calls"),
    ({"history": [{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": "7"}]}]},
     "history[0].tool_calls[0].arguments"),
])
def test_tools_and_tool_turns_out_of_their_rules_are_a_400_naming_them(body, field):
    with pytest.raises(ApiError) as info:
        read(body)
    assert (info.value.status, info.value.field) == (400, field)


def test_tools_and_a_tool_round_are_bounded_by_max_history_tokens():
    big = {"type": "function", "function": {"name": "f", "description": " ".join(["word"] * 20)}}
    assert read({"tools": [big]}, limit="40").tools
    with pytest.raises(ApiError) as info:
        read({"tools": [big]}, limit="10")
    assert info.value.field == "tools" and "MAX_HISTORY_TOKENS" in info.value.message


# ---------------------------------------------------------------- responses

def test_a_reply_with_calls_is_a_chat_completion_with_tool_calls():
    from openai.types.chat import ChatCompletion
    obj = out.completion("chatcmpl-1", 1700000000, MODEL, FinalAnswer.from_wire(REPLY))
    parsed = ChatCompletion.model_validate(obj)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None  # only whitespace besides
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_order_status", {"id": "ABC123"}), ("refund", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") and c.type == "function" for c in calls)
    plain = out.completion("c", 1, MODEL, FinalAnswer.from_wire({**REPLY, "generated_response": "text",
                                                                 "tool_calls": None, "finish_reason": "stop"}))
    assert "tool_calls" not in plain["choices"][0]["message"] and plain["choices"][0]["message"]["content"] == "text"


def test_a_streamed_reply_with_calls_is_tool_call_deltas_a_client_accumulates():
    from openai.types.chat import ChatCompletionChunk
    chunks = [ChatCompletionChunk.model_validate(obj)
              for obj in out.stream_chunks("chatcmpl-1", 1, MODEL, [AnswerPiece("\n"), FinalAnswer.from_wire(REPLY)],
                                           include_usage=True)]
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (call["name"], call["arguments"]) for call in REPLY["tool_calls"]]
    assert all(c["id"].startswith("call_") for c in calls.values())
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["tool_calls"] and chunks[-1].usage.completion_tokens == 20
    # The calls come before the last choice chunk.
    last = max(i for i, c in enumerate(chunks) if c.choices)
    assert all(not c.choices[0].delta.tool_calls for c in chunks[last:] if c.choices)
