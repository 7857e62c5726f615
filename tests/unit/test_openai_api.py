"""services/roles/gateway/openai_api.py: requests read, refused (never ignored) or translated, response
objects checked with the real `openai` package's types, and the real client against a tiny server built
from them; OpenAI's row of the error shapes."""
from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline import spec
from services.roles.gateway import openai_responses as out
from services.roles.gateway.openai_api import V1Request, parse_chat_request, parse_text_request
from services.server import sse
from services.server.answer import AnswerPiece, FinalAnswer, from_relay
from services.server.error_shapes import OPENAI
from services.server.errors import ApiError, HttpAnswer, http_answer

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
LIMIT = 128
REPLY = {"request_id": "r-1", "generated_response": "Answer: within 30 days 😀", "sentiment": "positive",
         "is_toxic": "false", "served_by": 0}


def typed(events: list) -> list:
    """Pieces (text) and a reply (JSON) as the answer type (services/server/answer.py)."""
    return [from_relay(event) for event in events]


def body(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "How do I return it?"}], **fields}


def parse(payload) -> V1Request:
    return parse_chat_request(payload, max_tokens_limit=LIMIT, model_id=MODEL)


def refused(payload, status: int = 400, parser=parse) -> ApiError:
    with pytest.raises(ApiError) as info:
        parser(payload)
    assert info.value.status == status
    return info.value


def error_body(error: ApiError) -> dict:
    """The error as an OpenAI client reads it."""
    answer = http_answer(error)
    assert answer is not None
    return OPENAI.body(answer, error.field)


# ---------------------------------------------------------------- requests

def test_a_minimal_request():
    assert parse(body()) == V1Request(query="How do I return it?", max_tokens=LIMIT, stream=False,
                                      request_id=None, include_usage=False, sampling={})


def test_the_question_is_the_last_user_message_and_the_contracts_own_system_message_adds_nothing():
    parts = {"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "two"}]}
    assert parse(body(messages=[parts])).query == "line one\ntwo"
    for role in ("system", "developer"):  # the prompt's own system message asks for nothing else
        contract = {"role": role, "content": spec.SYSTEM_PROMPT}
        assert parse(body(messages=[contract, {"role": "user", "content": "q"}])) == parse(
            body(messages=[{"role": "user", "content": "q"}]))


def test_earlier_turns_are_the_history_and_system_messages_the_instructions_in_order():
    messages = [{"role": "system", "content": spec.SYSTEM_PROMPT}, {"role": "user", "content": "My order is late."},
                {"role": "assistant", "content": [{"type": "text", "text": "Its number?"}]},
                {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "ABC123."},
                {"role": "system", "content": "Answer in French."}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "and now?"}]
    request = parse(body(messages=messages))
    assert request.query == "and now?"
    assert request.history == ({"role": "user", "content": "My order is late."},
                               {"role": "assistant", "content": "Its number?"},
                               {"role": "user", "content": "ABC123."}, {"role": "assistant", "content": ""})
    # The contract's own system prompt adds nothing; the others are added, in order.
    assert request.instructions == "Be brief.\n\nAnswer in French."
    assert parse(body()).history == () and parse(body()).instructions is None


@pytest.mark.parametrize("messages, param", [
    ([{"role": "tool", "content": "42", "tool_call_id": "c1", "tool_calls": []}, {"role": "user", "content": "q"}],
     "messages[0].tool_calls"),
    ([{"role": "user", "content": "q", "tool_call_id": "c1"}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]},
      {"role": "user", "content": "q"}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}]},
      {"role": "user", "content": "q"}], "messages[0].tool_calls[0].function.name"),
    ([{"role": "tool", "content": "42"}], "messages"),  # no question
    ([{"role": "function", "content": "42"}, {"role": "user", "content": "q"}], "messages[0].role"),
    ([{"role": "assistant", "content": None}, {"role": "user", "content": "q"}], "messages[0].content"),
    ([{"role": "system", "content": 7}, {"role": "user", "content": "q"}], "messages[0].content"),
    ([{"role": "user", "content": "q", "name": "ann"}], "messages[0].name"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "messages[1].role"),
    ([{"role": "assistant", "content": "\ud800"}, {"role": "user", "content": "q"}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}], "messages[0].content"),
])
def test_a_message_the_service_would_not_act_on_is_refused_naming_it(messages, param):
    assert refused(body(messages=messages)).field == param


def test_fields_read_at_a_no_op_value_ignored_or_null_are_accepted():
    request = parse(body(stream=True, stream_options={"include_usage": True}, max_completion_tokens=16, n=1,
                         temperature=0, top_p=1.0, presence_penalty=0, frequency_penalty=0.0, user="u", seed=7,
                         logprobs=False, response_format={"type": "text"}, tools=[], tool_choice="none", stop=None,
                         request_id="abc", store=False, min_p=0.0, skip_special_tokens=True, guided_json=None))
    assert request == V1Request(query="How do I return it?", max_tokens=16, stream=True, request_id="abc",
                                include_usage=True, sampling={"temperature": 0, "top_p": 1.0, "seed": 7})


def test_fields_that_cannot_change_the_answer_are_accepted_and_logged_by_name(caplog):
    caplog.set_level("INFO", logger="services.server.fields")
    request = parse(body(metadata={"customer": "c-9"}, user="u-1", service_tier="auto", store=False,
                         safety_identifier="s-1", stream=True,
                         stream_options={"include_usage": True, "include_obfuscation": False,
                                         "continuous_usage_stats": True}))
    assert request == parse(body(stream=True, stream_options={"include_usage": True}))
    logged = " ".join(record.getMessage() for record in caplog.records)
    for name in ("metadata", "user", "service_tier", "stream_options.include_obfuscation",
                 "stream_options.continuous_usage_stats"):
        assert name in logged
    assert "c-9" not in logged and "u-1" not in logged  # names, never the caller's values
    # What it reads of stream_options is still checked.
    assert refused(body(stream=True, stream_options={"include_usage": "yes"})).field == "stream_options.include_usage"


@pytest.mark.parametrize("fields, param", [
    ({"min_p": 0.1}, "min_p"), ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"repetition_penalty": 1.0}, "repetition_penalty"),  # none at all: not what the service does either
    ({"guided_json": {"type": "object"}}, "guided_json"), ({"guided_regex": "a+"}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"min_tokens": 4}, "min_tokens"), ({"ignore_eos": True}, "ignore_eos"),
    ({"some_future_field": [1, 2]}, "some_future_field"),
    ({"store": True}, "store"), ({"best_of": 2}, "best_of"),
])
def test_vllm_extras_and_unknown_fields_are_refused_naming_them(fields, param):
    error = refused(body(**fields))
    assert error.field == param and "not supported" in error.message
    assert error.code in ("unsupported_parameter", "unsupported_value")


def test_a_completions_body_reads_its_prompt_by_the_same_rules():
    text = {"model": MODEL, "prompt": "How do I return it?", "max_tokens": 9, "stop": ["\n"], "echo": False}
    parsed = parse_text_request(text, max_tokens_limit=LIMIT, model_id=MODEL)
    assert (parsed.query, parsed.max_tokens, parsed.sampling) == ("How do I return it?", 9, {"stop": ["\n"]})
    assert parse_text_request({**text, "prompt": ["one"]}, max_tokens_limit=LIMIT, model_id=MODEL).query == "one"
    text_parse = lambda payload: parse_text_request(payload, max_tokens_limit=LIMIT, model_id=MODEL)  # noqa: E731
    for change, param in (({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 2]}, "prompt"), ({"echo": True}, "echo"),
                          ({"suffix": "x"}, "suffix"), ({"logprobs": 21}, "logprobs"), ({"messages": []}, "messages"),
                          ({"min_p": 0.5}, "min_p")):
        assert refused({**text, **change}, parser=text_parse).field == param
    assert refused({k: v for k, v in text.items() if k != "prompt"}, parser=text_parse).field == "prompt"


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_bounds(key):
    assert parse(body(**{key: 1})).max_tokens == 1
    assert parse(body(**{key: LIMIT})).max_tokens == LIMIT
    assert parse(body(**{key: LIMIT + 1})).max_tokens == LIMIT  # clamped to the service's cap, not refused
    assert parse_chat_request(body(), max_tokens_limit=512, model_id=MODEL, default_max_tokens=128).max_tokens == 128
    assert refused(body(**{key: 0})).field == key
    assert refused(body(**{key: True})).field == key
    assert refused(body(**{key: 2.5})).field == key


def test_max_tokens_and_max_completion_tokens_must_agree():
    assert parse(body(max_tokens=9, max_completion_tokens=9)).max_tokens == 9
    assert refused(body(max_tokens=9, max_completion_tokens=10)).field == "max_tokens"


@pytest.mark.parametrize("payload, param", [
    ([], None),
    ({"messages": [{"role": "user", "content": "q"}]}, "model"),
    (body(model=3), "model"),
    ({"model": MODEL}, "messages"),
    (body(messages=[]), "messages"),
    (body(messages="hi"), "messages"),
    (body(messages=["hi"]), "messages[0]"),
    (body(messages=[{"content": "no role"}]), "messages[0]"),
    (body(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]), "messages[1].role"),
    (body(messages=[{"role": "user", "content": "  "}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0]"),
    (body(stream="yes"), "stream"),
    (body(stream_options={"include_usage": True}), "stream_options"),
    (body(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (body(request_id=""), "request_id"),
    (body(request_id=5), "request_id"),
])
def test_malformed_requests(payload, param):
    error = refused(payload)
    assert error.field == param and error_body(error)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("fields, param", [
    ({"best_of": 3}, "best_of"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"modalities": ["text", "audio"]}, "modalities"),
])
def test_unsupported_parameters_are_refused_not_ignored(fields, param):
    error = refused(body(**fields))
    assert error.field == param and error_body(error)["error"]["type"] == "invalid_request_error"
    assert "not supported" in error.message and error.code in ("unsupported_parameter", "unsupported_value")
    assert error_body(error)["error"]["param"] == param


def test_another_model_is_not_found():
    error = refused(body(model="gpt-4o"), 404)
    assert error_body(error) == {"error": {"message": error.message, "type": "invalid_request_error",
                                           "param": "model", "code": "model_not_found"}}
    assert "gpt-4o" in error.message and MODEL in error.message


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("status, type_, code", [
    (400, "invalid_request_error", None), (401, "invalid_request_error", "invalid_api_key"),
    (404, "invalid_request_error", "not_found"), (409, "invalid_request_error", "conflict"),
    (413, "invalid_request_error", "request_too_large"), (429, "rate_limit_error", "rate_limit_exceeded"),
    (500, "server_error", None), (503, "server_error", "service_unavailable"), (504, "server_error", "timeout"),
    (418, "invalid_request_error", None), (502, "server_error", None),
])
def test_openais_row_of_the_error_shapes(status, type_, code):
    assert OPENAI.body(HttpAnswer(status, "what happened"), "request_id") == \
        {"error": {"message": "what happened", "type": type_, "param": "request_id", "code": code}}
    assert OPENAI.headers(status) == {"x-should-retry": "true" if status in (429, 500, 502, 503, 504) else "false"}


def test_a_field_that_is_no_body_parameter_has_a_null_param_and_a_code_of_the_errors_own_wins():
    assert OPENAI.body(HttpAnswer(413, "m"), "body")["error"]["param"] is None
    assert OPENAI.body(HttpAnswer(504, "Request timeout"), None)["error"]["param"] is None
    assert OPENAI.body(HttpAnswer(400, "m", code="unsupported_value"), "n")["error"]["code"] == "unsupported_value"


# ---------------------------------------------------------------- responses, checked by the openai package

def stream_objects(text_pieces: list[str], include_usage: bool) -> list[dict]:
    reply = {**REPLY, "finish_reason": "length", "usage": {"prompt_tokens": 300, "completion_tokens": 7}}
    return list(out.stream_chunks("chatcmpl-1", 1700000000, MODEL, typed([*text_pieces, reply]),
                                  include_usage=include_usage))


def test_completion_is_a_valid_openai_chat_completion():
    from openai.types.chat import ChatCompletion
    counted = {**REPLY, "usage": {"prompt_tokens": 300, "completion_tokens": 12}}
    obj = out.completion("chatcmpl-1", 1700000000, MODEL, FinalAnswer.from_wire(counted))
    parsed = ChatCompletion.model_validate(obj)
    assert parsed.choices[0].message.content == REPLY["generated_response"]
    assert parsed.choices[0].message.role == "assistant" and parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.total_tokens == 312
    assert parsed.model_extra == {"rag": {"sentiment": "positive", "is_toxic": "false", "request_id": "r-1"}}
    assert out.completion("c", 1, MODEL, FinalAnswer.from_wire({**REPLY, "finish_reason": "length"}))["choices"][0][
        "finish_reason"] == "length"
    with pytest.raises(ValueError):  # FinishReason is OpenAI's three (pipeline/continuous/output.py)
        FinalAnswer.from_wire({**REPLY, "finish_reason": "content_filter"})


@pytest.mark.parametrize("include_usage", [False, True])
def test_chunks_are_valid_openai_chunks(include_usage):
    from openai.types.chat import ChatCompletionChunk
    pieces = ["Answer", ":", " within", " 30 days 😀"]
    chunks = [ChatCompletionChunk.model_validate(obj) for obj in stream_objects(pieces, include_usage)]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    choice_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in choice_chunks) == "".join(pieces)
    last = choice_chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.choices[0].delta.content is None
    assert last.model_extra is not None and last.model_extra["rag"]["sentiment"] == "positive"
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 307
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("include_usage", [False, True])
def test_text_completions_and_their_chunks_are_valid_openai_completions(include_usage):
    from openai.types import Completion
    reply = {**REPLY, "finish_reason": "length", "usage": {"prompt_tokens": 300, "completion_tokens": 7}, "seed": 3}
    whole = Completion.model_validate(out.text_completion("cmpl-1", 1700000000, MODEL, FinalAnswer.from_wire(reply)))
    assert whole.choices[0].text == REPLY["generated_response"] and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.total_tokens == 307 and whole.model_extra["seed"] == 3
    pieces = ["Answer", ": within 30 days 😀"]
    objects = list(out.text_chunks("cmpl-1", 1700000000, MODEL, typed([*pieces, reply]), include_usage=include_usage))
    # A piece's finish_reason is null, as OpenAI's own stream sends it (the SDK reads chunks unvalidated).
    chunks = [Completion.model_validate(obj) if not obj["choices"] or obj["choices"][0]["finish_reason"]
              else Completion.model_construct(**obj) for obj in objects]
    assert [obj["choices"][0]["text"] for obj in objects[:len(pieces)]] == pieces
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"] and objects[len(pieces)]["rag"]["sentiment"] == "positive"
    assert (chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7) if include_usage else \
        all(c.usage is None for c in chunks)


def test_error_body_is_a_valid_openai_error_object():
    from openai.types.shared import ErrorObject
    error = ErrorObject.model_validate(error_body(refused(body(n=9)))["error"])
    assert error.type == "invalid_request_error" and error.param == "n"


# ---------------------------------------------------------------- the real client against these objects

class FakeOpenAIServer:
    """POST /v1/chat/completions answered from this module's objects, for the real openai client."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    request = parse(payload)
                except ApiError as error:
                    return self._send(error.status, json.dumps(error_body(error)).encode(), "application/json")
                if not request.stream:
                    counted = {**REPLY, "usage": {"prompt_tokens": 300, "completion_tokens": 12}}
                    obj = out.completion("chatcmpl-1", 1700000000, MODEL, FinalAnswer.from_wire(counted))
                    return self._send(200, json.dumps(obj).encode(), "application/json")
                events = [sse.event(obj) for obj in stream_objects(["Answer", ": ok"], request.include_usage)]
                self._send(200, b"".join(events) + sse.event(out.DONE), sse.HEADERS["Content-Type"])

            def _send(self, status: int, data: bytes, kind: str):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)


@pytest.fixture()
def openai_client(monkeypatch):
    import platform

    import openai
    # The client names the OS in a header; platform.platform() would find it by running `uname -p`.
    monkeypatch.setattr(platform, "platform", lambda *args, **kwargs: "Linux")
    fake = FakeOpenAIServer()
    fake.thread.start()
    try:
        yield openai.OpenAI(base_url=fake.url, api_key="unused", max_retries=0, timeout=10)
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def test_the_openai_client_reads_a_completion(openai_client):
    reply = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}])
    assert reply.choices[0].message.content == REPLY["generated_response"]
    assert reply.model_extra is not None and reply.model_extra["rag"]["is_toxic"] == "false"


def test_the_openai_client_reads_a_stream(openai_client):
    stream = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}],
                                                   stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Answer: ok"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7


def test_the_openai_client_raises_our_errors(openai_client):
    import openai
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}], n=9)
    assert info.value.status_code == 400 and info.value.param == "n" and "from 1 to 8" in info.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}])
    assert missing.value.code == "model_not_found"


# ---------------------------------------------------------------- log probabilities

def test_log_probabilities_are_read_by_openais_rules_on_each_route():
    chat = lambda **fields: parse_chat_request(body(**fields), max_tokens_limit=LIMIT, model_id=MODEL)  # noqa: E731
    assert chat().logprobs is None and chat(logprobs=False).logprobs is None
    assert chat(logprobs=True).logprobs == 0 and chat(logprobs=True, top_logprobs=20).logprobs == 20
    for fields, param in (({"logprobs": 0}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
                          ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                          ({"logprobs": True, "top_logprobs": True}, "top_logprobs")):
        assert refused(body(**fields)).field == param
    text = {"model": MODEL, "prompt": "How do I return it?"}
    assert parse_text_request({**text, "logprobs": 3}, max_tokens_limit=LIMIT, model_id=MODEL).logprobs == 3
    assert parse_text_request(text, max_tokens_limit=LIMIT, model_id=MODEL).logprobs is None


def test_the_workers_log_probabilities_take_each_routes_shape_chunk_by_chunk_in_a_stream():
    from services.roles.gateway.openai_responses import completion, stream_chunks, text_chunks, text_completion
    items = [{"token": "Re", "logprob": -0.5, "bytes": [82, 101], "top_logprobs": [
                 {"token": "Re", "logprob": -0.5, "bytes": [82, 101]}, {"token": "We", "logprob": -1.5, "bytes": [87, 101]}]},
             {"token": "funds", "logprob": -0.25, "bytes": list(b"funds"), "top_logprobs": [
                 {"token": "funds", "logprob": -0.25, "bytes": list(b"funds")}]}]
    reply = FinalAnswer.from_wire({"request_id": "r", "generated_response": "Refunds", "sentiment": "neutral",
                                   "is_toxic": "false", "logprobs": items,
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    chat_choice = completion("c", 0, MODEL, reply)["choices"][0]
    assert chat_choice["logprobs"] == {"content": items, "refusal": None}
    assert completion("c", 0, MODEL, dataclasses.replace(reply, logprobs=None))["choices"][0]["logprobs"] is None
    legacy = text_completion("t", 0, MODEL, reply)["choices"][0]["logprobs"]
    assert legacy == {"tokens": ["Re", "funds"], "token_logprobs": [-0.5, -0.25],
                      "top_logprobs": [{"Re": -0.5, "We": -1.5}, {"funds": -0.25}], "text_offset": [0, 2]}
    # Each piece with the tokens it came from (OpenAI's stream): the last choice chunk has none left to give.
    pieces = [AnswerPiece("Re", (items[0],)), AnswerPiece("funds", (items[1],)), reply]
    chunks = list(stream_chunks("c", 0, MODEL, pieces))
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        None, {"content": [items[0]], "refusal": None}, {"content": [items[1]], "refusal": None}, None]
    texts = list(text_chunks("t", 0, MODEL, pieces))
    assert [c["choices"][0]["logprobs"] for c in texts] == [
        {"tokens": ["Re"], "token_logprobs": [-0.5], "top_logprobs": [{"Re": -0.5, "We": -1.5}], "text_offset": [0]},
        {"tokens": ["funds"], "token_logprobs": [-0.25], "top_logprobs": [{"funds": -0.25}], "text_offset": [2]}, None]
    # Pieces that did not bring them (a replayed answer): the last choice chunk gives them all.
    chunks = list(stream_chunks("c", 0, MODEL, [AnswerPiece("Re"), AnswerPiece("funds"), reply]))
    assert [c["choices"][0]["logprobs"] for c in chunks] == [None, None, None, {"content": items, "refusal": None}]
    texts = list(text_chunks("t", 0, MODEL, [AnswerPiece("Re"), AnswerPiece("funds"), reply]))
    assert [c["choices"][0]["logprobs"] for c in texts] == [None, None, legacy]


def test_parallel_tool_calls_false_is_read_and_reaches_the_worker():
    from services.roles.gateway.routing import WorkerTarget
    from tests.unit.test_gateway import gateway
    from tests.unit.test_gateway_role import Outcomes, query_app
    assert parse_chat_request(body(parallel_tool_calls=False), max_tokens_limit=LIMIT, model_id=MODEL) \
        .parallel_tool_calls is False
    role, client = query_app([])
    bad = client.post("/v1/chat/completions", json=body(parallel_tool_calls="no"))
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "parallel_tool_calls"
    seen: list = []
    outcomes = Outcomes([{"generated_response": "ok", "sentiment": "neutral", "is_toxic": "false"}])
    role.gateway.set(gateway(WorkerTarget(node=0, answer=lambda r, d: (seen.append(r), outcomes.answer(r, d))[1],
                                          probe=lambda: True, local=True)))
    assert client.post("/v1/chat/completions", json=body(parallel_tool_calls=False)).status_code == 200
    assert seen[-1].parallel_tool_calls is False
