"""Node 0's streaming /query and OpenAI-compatible routes over a real Gateway and a fake worker
(no models): the SSE events, the errors before and after a stream starts, OpenAI's shapes checked
with the openai package's own types."""
from __future__ import annotations

import json

import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from pipeline import spec
from services.server import sse
from services.server.errors import Overloaded, StageFailed
from tests.unit.test_gateway import REPLY, query_app

pytestmark = pytest.mark.timeout(60)

ANSWER = {**REPLY, "generated_response": "Answer: return it within 30 days"}
CHAT = {"model": spec.GENERATOR_MODEL, "messages": [{"role": "user", "content": "How do I return an item?"}]}


def events(response) -> list[sse.SseEvent]:
    return list(sse.iter_events(response.get_data().splitlines(keepends=True)))


def test_query_with_stream_true_sends_pieces_then_the_reply_and_without_it_the_plain_reply():
    role, client = query_app([ANSWER, ANSWER])
    streamed = client.post("/query", json={"request_id": "s-1", "query": "Return?", "stream": True})
    assert streamed.status_code == 200 and streamed.headers["Content-Type"].startswith("text/event-stream")
    got = events(streamed)
    assert [e.name for e in got] == ["token"] * 6 + ["reply"]
    pieces = "".join(e.json()["text"] for e in got[:-1])
    reply = got[-1].json()
    assert pieces == reply["generated_response"] == ANSWER["generated_response"]
    assert (reply["request_id"], reply["sentiment"], reply["is_toxic"], reply["served_by"]) == ("s-1", "neutral",
                                                                                                  "false", 0)
    plain = client.post("/query", json={"request_id": "p-1", "query": "Return it?"})  # not the cached question
    assert plain.get_json() == {**ANSWER, "request_id": "p-1", "served_by": 0}


def test_a_streamed_reply_fills_the_reply_cache_and_a_hit_streams_as_one_piece_then_the_reply():
    role, client = query_app([ANSWER])  # one outcome: a second computation would fail the test
    first = events(client.post("/query", json={"request_id": "h-1", "query": "Return?", "stream": True}))
    hit = events(client.post("/query", json={"request_id": "h-2", "query": "return?", "stream": True}))
    assert [e.name for e in hit] == ["token", "reply"] and hit[0].json()["text"] == ANSWER["generated_response"]
    assert hit[-1].json()["cached"] is True and hit[-1].json()["request_id"] == "h-2"
    assert hit[-1].json()["generated_response"] == first[-1].json()["generated_response"]


def test_an_accept_header_asks_for_a_stream_too_and_a_bad_stream_flag_is_a_400():
    role, client = query_app([ANSWER])
    r = client.post("/query", json={"request_id": "a-1", "query": "Return?"}, headers={"Accept": "text/event-stream"})
    assert [e.name for e in events(r)][-1] == "reply"
    bad = client.post("/query", json={"request_id": "a-2", "query": "Return?", "stream": "yes"})
    assert bad.status_code == 400 and bad.get_json() == {"error": "'stream' must be true or false", "field": "stream"}


def test_a_stream_refused_before_its_first_token_gets_its_status_not_a_stream():
    role, client = query_app([Overloaded("the worker is full", retry_after_s=2)])
    r = client.post("/query", json={"request_id": "o-1", "query": "Return?", "stream": True})
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"
    assert r.get_json() == {"error": "overloaded: the worker is full"}


def test_a_retried_request_id_streams_the_answer_it_got_and_is_not_recomputed():
    role, client = query_app([ANSWER])  # one outcome: a second computation would fail the test
    first = events(client.post("/query", json={"request_id": "r-1", "query": "Return?", "stream": True}))
    again = events(client.post("/query", json={"request_id": "r-1", "query": "Return?", "stream": True}))
    assert again[-1].json()["generated_response"] == first[-1].json()["generated_response"]
    assert "".join(e.json()["text"] for e in again[:-1]) == ANSWER["generated_response"]
    conflict = client.post("/query", json={"request_id": "r-1", "query": "Another question", "stream": True})
    assert conflict.status_code == 409


def test_models_lists_the_served_model_in_openais_shape():
    role, client = query_app([])
    body = client.get("/v1/models").get_json()
    assert body["object"] == "list"
    assert [Model.model_validate(m).id for m in body["data"]] == [spec.GENERATOR_MODEL, spec.EMBEDDER_MODEL]


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
    ({"n": 2}, 400, "n"),
    ({"temperature": 2.5}, 400, "temperature"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
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


def test_an_error_after_a_stream_started_is_its_last_event():
    role, client = query_app([ANSWER])
    gateway = role.gateway.require()

    def failing(request, timeout_s):
        yield "Answer:"
        raise StageFailed("sentiment", RuntimeError("boom"))

    gateway.router.targets[0].answer = failing
    got = events(client.post("/query", json={"request_id": "f-1", "query": "Return?", "stream": True}))
    assert [e.name for e in got] == ["token", "error"]
    assert got[-1].json()["status"] == 500
    chat = events(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert json.loads(chat[-1].data)["error"]["type"] == "server_error"


def test_a_stream_past_its_deadline_ends_with_a_504_error_event():
    from services.server.errors import RequestTimeout
    role, client = query_app([ANSWER])

    target = role.gateway.require().router.targets[0]
    worker = target.answer

    def slow(request, timeout_s):  # once: the retry below gets the worker's answer
        target.answer = worker
        yield "Answer:"
        raise RequestTimeout("request timed out")  # what TokenStream.read raises at the deadline

    target.answer = slow
    got = events(client.post("/query", json={"request_id": "d-1", "query": "Return?", "stream": True}))
    assert [e.name for e in got] == ["token", "error"]
    assert got[-1].json() == {"error": "Request timeout", "status": 504}
    retry = client.post("/query", json={"request_id": "d-1", "query": "Return?"})  # a failure is not kept
    assert retry.status_code == 200 and retry.get_json()["generated_response"] == ANSWER["generated_response"]
