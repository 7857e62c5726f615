"""Tool calls through a real cluster on 127.0.0.1: the `openai` SDK and LangChain's `bind_tools` get the
model's `tool_calls` (plain and streamed, `finish_reason` "tool_calls"), and the tool message they send
back is answered. Both workers (nodes 0 and 1) are tests.support.tool_calling_node: the real engine,
output processor and routes, with the stand-in's noise replaced by the token ids of a Qwen2.5 call
wherever the prompt offers tools and holds no call yet (the stand-in never writes one itself)."""
from __future__ import annotations

import json
import sys

import openai
import pytest

from pipeline import spec
from tests.helpers import start_cluster
from tests.support.tool_calling_node import CALL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHAT_MODEL = spec.GENERATOR_MODEL
QUESTION = "Where is my order ABC123?"
TOOL = {"type": "function", "function": {
    "name": "get_order_status", "description": "The status of a customer's order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}
RESULT = json.dumps({"order_id": "ABC123", "status": "shipped"})


@pytest.fixture(scope="module")
def cluster(course_data, tmp_path_factory):
    command = [sys.executable, "-m", "tests.support.tool_calling_node"]
    cluster = start_cluster(course_data, tmp_path_factory.mktemp("tool-call-logs"), commands={0: command, 1: command})
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url(0)}/v1", api_key="k", max_retries=0, timeout=300)


def ask(client: openai.OpenAI, messages: list, **kwargs):
    return client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=64, **kwargs)


def test_the_sdk_gets_the_call_and_its_tool_message_is_answered(client):
    messages: list = [{"role": "user", "content": QUESTION}]
    first = ask(client, messages, tools=[TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == CALL["name"] and json.loads(call.function.arguments) == CALL["arguments"]
    # The SDK's chat loop: the assistant message as it came, then the tool's result.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    second = ask(client, messages, tools=[TOOL])
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert isinstance(answer.message.content, str) and answer.message.content
    # The call and the result are in the prompt, rendered after the question.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_the_sdk_streams_the_call_as_deltas(client):
    pieces = []  # per stream: the argument deltas it sent
    for _ in range(2):  # round robin: one of them is node 0's own worker's
        calls: dict[int, dict] = {}
        reasons, text, arguments = [], [], []
        for chunk in ask(client, [{"role": "user", "content": QUESTION}], tools=[TOOL], stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text.append(delta.content or "")
            for part in delta.tool_calls or []:
                entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += part.id or ""
                entry["name"] += part.function.name or ""
                entry["arguments"] += part.function.arguments or ""
                arguments.append(part.function.arguments)
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
        assert reasons == ["tool_calls"] and "".join(text).strip() == ""
        assert list(calls) == [0] and calls[0]["name"] == CALL["name"] and calls[0]["id"].startswith("call_")
        assert json.loads(calls[0]["arguments"]) == CALL["arguments"]
        pieces.append(len([a for a in arguments if a]))
    assert max(pieces) > 1  # its arguments in pieces as they are generated, not whole


def test_tool_choice_none_shows_no_tools_and_reads_no_call(client):
    plain = ask(client, [{"role": "user", "content": QUESTION}], tools=[TOOL], tool_choice="none")
    offered = ask(client, [{"role": "user", "content": QUESTION}], tools=[TOOL])
    assert plain.choices[0].finish_reason in ("stop", "length") and not plain.choices[0].message.tool_calls
    assert plain.usage.prompt_tokens < offered.usage.prompt_tokens  # the tools were not rendered
    named = ask(client, [{"role": "user", "content": QUESTION}], tools=[TOOL],
                tool_choice={"type": "function", "function": {"name": "get_order_status"}})
    assert named.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, [{"role": "user", "content": QUESTION}], tools=[TOOL], tool_choice="required")
    assert info.value.body["param"] == "tool_choice"


def test_langchain_bind_tools_gets_the_call_and_its_tool_message_is_answered(cluster):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=CHAT_MODEL, base_url=f"{cluster.url(0)}/v1", api_key="k", temperature=0, max_tokens=64,
                     max_retries=0, timeout=300).bind_tools([TOOL])
    question = HumanMessage(QUESTION)
    called = llm.invoke([question])
    assert called.response_metadata["finish_reason"] == "tool_calls"
    (call,) = called.tool_calls
    assert call["name"] == CALL["name"] and call["args"] == CALL["arguments"]
    answer = llm.invoke([question, called, ToolMessage(RESULT, tool_call_id=call["id"])])
    assert answer.response_metadata["finish_reason"] in ("stop", "length") and not answer.tool_calls
    assert isinstance(answer.content, str) and answer.content
