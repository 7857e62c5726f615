"""services/roles/gateway/openai_routes.py: node 0's /v1 routes over a real Gateway and a fake worker (no
models): /v1/models, chat completions plain and streamed, OpenAI's error shape before and after a
stream starts, the shapes checked with the openai package's own types."""
from __future__ import annotations

import json

import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from pipeline import spec
from services.server.errors import Overloaded
from tests.unit.test_gateway_role import ANSWER, events, failing_after_one_piece, query_app

pytestmark = pytest.mark.timeout(60)


CHAT = {"model": spec.GENERATOR_MODEL, "messages": [{"role": "user", "content": "How do I return an item?"}]}


def test_models_lists_the_served_model_in_openais_shape():
    role, client = query_app([])
    body = client.get("/v1/models").get_json()
    assert body["object"] == "list"
    assert [Model.model_validate(m).id for m in body["data"]] == [spec.GENERATOR_MODEL, spec.EMBEDDER_MODEL,
                                                                  spec.RERANKER_MODEL, spec.TOXICITY_MODEL]


def test_a_chat_completion_is_one_rag_answer_with_usage_and_the_rag_fields():
    role, client = query_app([ANSWER])
    r = client.post("/v1/chat/completions", json={**CHAT, "request_id": "c-1"})
    assert r.status_code == 200, r.get_data()
    completion = ChatCompletion.model_validate(r.get_json())
    assert completion.choices[0].message.content == ANSWER["generated_response"]
    assert completion.choices[0].finish_reason == "stop"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (40, 6)
    assert r.get_json()["rag"] == {"sentiment": "neutral", "is_toxic": "false", "request_id": "c-1"}


def test_a_streamed_chat_completion_is_chunks_then_done_and_joins_to_the_answer():
    role, client = query_app([ANSWER])
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    got = events(r)
    assert got[-1].data == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(e.json()) for e in got[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER["generated_response"]
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("change,status,param", [
    ({"n": 9}, 400, "n"),
    ({"temperature": 2.5}, 400, "temperature"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, 400, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
                                                                                  "function": {"name": "g"}}},
     400, "tool_choice"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"messages": []}, 400, "messages"),
])
def test_unsupported_or_bad_chat_parameters_get_openais_error_shape(change, status, param):
    role, client = query_app([ANSWER])
    r = client.post("/v1/chat/completions", json={**CHAT, **change})
    assert r.status_code == status, r.get_data()
    error = r.get_json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_the_services_own_errors_reach_an_openai_client_in_its_shape_with_the_status():
    role, client = query_app([Overloaded("the gateway is at capacity", retry_after_s=3)])
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["Retry-After"] == "3"
    assert r.get_json()["error"]["type"] == "server_error"
    long = client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
    assert long.status_code == 400 and long.get_json()["error"]["param"] == "messages"


def test_an_error_after_a_chat_stream_started_is_its_last_event_in_openais_shape():
    client = failing_after_one_piece()
    chat = events(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert json.loads(chat[-1].data)["error"]["type"] == "server_error"
