"""/openapi.json, built from the routes' pydantic models (services/roles/gateway/openapi.py): every
route of node 0 in it and nothing else, the recorded client bodies and the routes' own requests valid
against the request schemas, the routes' objects and errors valid against the response schemas, and
docs/api.md's list of paths the document's."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from pipeline import spec
from pipeline.tool_calls import ToolCall, ToolCallDelta
from services.roles.gateway.openai_api import ROUTE_FIELDS
from services.roles.gateway.openai_embeddings import FIELDS as EMBEDDING_FIELDS
from services.roles.gateway.openai_embeddings import embeddings_response
from services.roles.gateway.openai_responses import stream_chunks, text_chunks
from services.roles.gateway.openai_scoring import (
    MODERATION_FIELDS,
    RERANK_FIELDS,
    moderation_response,
    rerank_response,
)
from services.roles.gateway.openapi import openapi_document
from services.roles.gateway.role import QUERY_FIELDS
from services.roles.gateway.tokenize_routes import CHAT_FIELDS, DETOKENIZE_FIELDS, PROMPT_FIELDS, tokenize_response
from services.server.answer import AnswerPiece, FinalAnswer
from tests.unit.test_gateway_role import query_app

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "client_requests"
CHAT = {"model": spec.GENERATOR_MODEL, "messages": [{"role": "user", "content": "How do I return it?"}]}
REPLY = {"generated_response": "Returns take 30 days.", "sentiment": "neutral", "is_toxic": "false"}


def check(instance, path: str, method: str, part: str = "request", status: str = "200",
          media: str = "application/json") -> None:
    document = openapi_document()
    operation = document["paths"][path][method]
    holder = operation["requestBody"] if part == "request" else operation["responses"][status]
    schema = {**holder["content"][media]["schema"], "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(instance)


def test_the_document_is_served_and_holds_exactly_the_routes_that_exist():
    _role, client = query_app([])
    routes = {(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
              for rule in client.application.url_map.iter_rules() if rule.endpoint != "static"
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    document = client.get("/openapi.json").get_json()
    assert document == openapi_document() and document["openapi"].startswith("3.1")
    assert {(path, method) for path, item in document["paths"].items() for method in item} == routes
    jsonschema.Draft202012Validator.check_schema({"components": document["components"]})
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(document)))
    assert refs <= set(document["components"]["schemas"])  # every reference resolves


def test_no_hand_kept_copy_remains():
    assert not (ROOT / "services" / "roles" / "gateway" / "openapi.json").exists()


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_every_recorded_client_body_is_valid_against_its_routes_request_schema(fixture):
    recorded = json.loads(fixture.read_text())
    check(recorded["body"], recorded["path"], "post")


@pytest.mark.parametrize(("path", "body"), [
    ("/query", {"request_id": "r", "query": "q", "stream": True,
                "history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
    ("/v1/completions", {"model": spec.GENERATOR_MODEL, "prompt": ["q"], "logprobs": 2, "n": 2, "stop": "x",
                         "best_of": 1, "echo": False, "user": "u"}),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "text"}, "logit_bias": {}, "store": None}),
    ("/v1/embeddings", {"model": spec.EMBEDDER_MODEL, "input": ["a", "b"], "encoding_format": "base64"}),
    ("/v1/rerank", {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}),
    ("/v1/moderations", {"input": ["a", {"type": "text", "text": "b"}]}),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": True}),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}),
    ("/detokenize", {"tokens": [1, 2, 3]}),
])
def test_accepted_bodies_are_valid(path, body):
    check(body, path, "post")


@pytest.mark.parametrize(("path", "body"), [
    ("/query", {"request_id": "r", "query": "q", "temperature": 1}),
    ("/v1/chat/completions", {**CHAT, "n": 9}),
    ("/v1/chat/completions", {**CHAT, "repetition_penalty": 1.1}),
    ("/v1/chat/completions", {**CHAT, "store": True}),
    ("/v1/completions", {"model": spec.GENERATOR_MODEL, "prompt": "q", "tools": []}),
    ("/v1/chat/completions", {"model": "m", "messages": []}),
    ("/v1/embeddings", {"model": spec.EMBEDDER_MODEL, "input": "a", "dimensions": "768"}),  # its value: the route's
    ("/v1/rerank", {"query": "q", "documents": [], "model": spec.RERANKER_MODEL}),
    ("/tokenize", {"prompt": "hi", "return_token_strs": True}),
    ("/detokenize", {"tokens": [-1]}),
])
def test_refused_bodies_are_invalid(path, body):
    with pytest.raises(jsonschema.ValidationError):
        check(body, path, "post")


def test_the_routes_objects_and_errors_are_valid_against_the_response_schemas():
    _role, client = query_app([REPLY, REPLY, REPLY])
    check(client.post("/query", json={"request_id": "q", "query": "q"}).get_json(), "/query", "post", "response")
    chat = client.post("/v1/chat/completions", json={**CHAT, "logprobs": False}).get_json()
    check(chat, "/v1/chat/completions", "post", "response")
    text = client.post("/v1/completions", json={"model": spec.GENERATOR_MODEL, "prompt": "q?"}).get_json()
    check(text, "/v1/completions", "post", "response")
    check(client.get("/v1/models").get_json(), "/v1/models", "get", "response")
    check(client.get(f"/v1/models/{spec.RERANKER_MODEL}").get_json(), "/v1/models/{model_id}", "get", "response")
    missing = client.get("/v1/models/gpt-4o")
    check(missing.get_json(), "/v1/models/{model_id}", "get", "response", str(missing.status_code))
    refused = client.post("/query", json={"request_id": "q", "query": "q", "temperature": 1})
    check(refused.get_json(), "/query", "post", "response", str(refused.status_code))
    vector = np.ones(spec.EMBED_DIM, np.float32)
    for encoding in ("float", "base64"):
        check(embeddings_response([vector], encoding, 2, spec.EMBEDDER_MODEL), "/v1/embeddings", "post", "response")
    check(rerank_response([0.5, -1.0], ["a", "b"], None, True, 7), "/v1/rerank", "post", "response")
    check(moderation_response([{"toxic": 0.2, "insult": 0.7}]), "/v1/moderations", "post", "response")
    check(tokenize_response([1, 2], 32768), "/tokenize", "post", "response")
    check({"prompt": "hi"}, "/detokenize", "post", "response")


@pytest.mark.parametrize("include_usage", [False, True])
def test_streamed_chunks_are_valid_against_the_event_stream_schemas(include_usage):
    reply = FinalAnswer.from_wire({**REPLY, "request_id": "r", "seed": 3, "finish_reason": "tool_calls",
                                   "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                                   "tool_calls": [{"name": "f", "arguments": '{"a": 1}'}]})
    # A call streamed in pieces (its name, then its arguments), and one given whole with the last chunk.
    streamed = [AnswerPiece("Re"), AnswerPiece(tool_call=ToolCallDelta(0, "g", '{"b"')),
                AnswerPiece(tool_call=ToolCallDelta(0, None, ": 2}")), AnswerPiece("funds"),
                dataclasses.replace(reply, tool_calls=(ToolCall("g", '{"b": 2}'), *reply.tool_calls))]
    chunks = list(stream_chunks("c", 0, spec.GENERATOR_MODEL, streamed, include_usage=include_usage))
    assert sum(1 for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"]) == 3
    for obj in chunks:
        check(obj, "/v1/chat/completions", "post", "response", media="text/event-stream")
    texts = text_chunks("t", 0, spec.GENERATOR_MODEL, [AnswerPiece("Re"), AnswerPiece("funds"),
                                                       dataclasses.replace(reply, finish_reason="length")],
                        include_usage=include_usage)
    for obj in texts:
        check(obj, "/v1/completions", "post", "response", media="text/event-stream")


def test_docs_api_lists_the_documents_paths():
    text = (ROOT / "docs" / "api.md").read_text()
    listed = re.search(r"# (\['/'.*\])", text)
    assert listed is not None and json.loads(listed.group(1).replace("'", '"')) == sorted(openapi_document()["paths"])


def test_each_request_schema_holds_exactly_the_fields_its_routes_rules_accept():
    schemas = openapi_document()["components"]["schemas"]
    tables = (("ChatCompletionRequest", ROUTE_FIELDS["chat"]), ("CompletionRequest", ROUTE_FIELDS["text"]),
              ("EmbeddingRequest", EMBEDDING_FIELDS), ("RerankRequest", RERANK_FIELDS),
              ("ModerationRequest", MODERATION_FIELDS), ("TokenizePromptRequest", PROMPT_FIELDS),
              ("TokenizeChatRequest", CHAT_FIELDS), ("DetokenizeRequest", DETOKENIZE_FIELDS))
    for name, rules in tables:
        accepted = {*rules.read, *rules.no_op, *rules.ignored}
        assert set(schemas[name]["properties"]) == accepted and schemas[name]["additionalProperties"] is False, name
    assert set(schemas["Query"]["properties"]) == set(QUERY_FIELDS) and schemas["Query"]["additionalProperties"] is False
