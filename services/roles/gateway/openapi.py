"""Node 0's OpenAPI document, built from the routes' pydantic models (openai_schemas.py,
endpoint_schemas.py; the errors' in services/server/error_shapes.py) and the table of routes
below; served at /openapi.json, no file kept.

`python -m services.roles.gateway.openapi` prints it; `--write PATH` writes it to PATH.
"""
from __future__ import annotations

import argparse
import json
from functools import cache
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from services.roles.gateway import endpoint_schemas as es
from services.roles.gateway import openai_schemas as oa
from services.roles.gateway.openai_api import NO_OP
from services.server.error_shapes import OpenAIError, ServiceError

REF = "#/components/schemas/{model}"
INFO = {"title": "RAG customer-support service (node 0)", "version": "1.0", "description": (
    "/query (the contract) and an OpenAI-compatible /v1. With API_KEYS_FILE set, /query, /tokenize, /detokenize "
    "and /v1/* need 'Authorization: Bearer <key>'. Every /v1 error is OpenAI's {error: {message, type, param, "
    "code}} with an x-should-retry header.")}

# the public routes: summary, request body, 200's object and description, the errors they answer
PUBLIC: dict[tuple[str, str], tuple[str, Any, type[BaseModel], str, tuple[int, ...]]] = {
    ("/query", "post"): ("The contract's query: a grounded, greedy answer (SSE with stream: true)",
                         oa.Query, oa.QueryReply, "the reply", (400, 401, 409, 413, 503, 504)),
    ("/v1/chat/completions", "post"): (
        "OpenAI chat completions: the latest user message is the question, answered through the RAG pipeline "
        "after the conversation before it", oa.ChatCompletionRequest, oa.ChatCompletion,
        "a chat.completion, or chat.completion.chunk events with stream: true", (400, 401, 404, 409, 413, 503, 504)),
    ("/v1/completions", "post"): (
        "OpenAI (legacy) completions: the prompt is the question, answered through the RAG pipeline",
        oa.CompletionRequest, oa.TextCompletion, "a text_completion, or text_completion events with stream: true",
        (400, 401, 404, 409, 413, 503, 504)),
    ("/v1/embeddings", "post"): ("Embeddings with the query embedder (BAAI/bge-base-en-v1.5, 768 floats, unit norm)",
                                 es.EmbeddingRequest, es.EmbeddingList, "the vectors", (400, 401, 404, 413, 503, 504)),
    ("/v1/rerank", "post"): (
        "Documents ranked for a query by the reranker (BAAI/bge-reranker-base), as Cohere's, Jina's and vLLM's "
        "rerank APIs", es.RerankRequest, es.RerankResponse, "the documents by relevance, best first",
        (400, 401, 404, 413, 503, 504)),
    ("/v1/moderations", "post"): (
        "Texts classified by the toxicity model (unitary/toxic-bert), in OpenAI's moderation shape",
        es.ModerationRequest, es.ModerationResponse, "one result per input", (400, 401, 404, 413, 503, 504)),
    ("/tokenize", "post"): (
        "Token ids of a prompt or of chat messages as the chat template renders them (vLLM's /tokenize), with the "
        "LLM's tokenizer", es.TokenizeRequest, es.TokenizeResponse, "the token ids", (400, 401, 404, 413, 503, 504)),
    ("/detokenize", "post"): ("Text of token ids, control tokens written out (vLLM's /detokenize)",
                              es.DetokenizeRequest, es.DetokenizeResponse, "the text", (400, 401, 404, 413, 503, 504)),
    ("/v1/models", "get"): ("The models served", None, es.ModelList, "the list", (401,)),
    ("/v1/models/{model_id}", "get"): ("One model", None, es.Model, "the model", (401, 404)),
}
# stream: true's events' data, each a JSON object
STREAMED: dict[tuple[str, str], type[BaseModel]] = {("/v1/chat/completions", "post"): oa.ChatCompletionChunk,
                                                   ("/v1/completions", "post"): oa.TextCompletionChunk}
ERRORS = {400: "invalid request (the param names the field)", 401: "missing or invalid API key (API_KEYS_FILE set)",
          404: "unknown model or path", 409: "request_id reused with another question",
          413: "body over MAX_BODY_BYTES", 503: "overloaded, starting or stopping (Retry-After)",
          504: "REQUEST_TIMEOUT_S passed"}
TOKEN = " (cluster token: X-Cluster-Token)"
VERSION_BODY = {"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}}
DONE = "done: the node's data versions"
# the open and the operators' routes: summary, request body's schema, {status: description}
OTHERS: dict[tuple[str, str], tuple[str, dict[str, Any] | None, dict[int, str]]] = {
    ("/health", "get"): ("Health with details (open)", None, {200: "healthy", 503: "not healthy"}),
    ("/ready", "get"): ("Readiness for a load balancer (open)", None, {200: "ready", 503: "not ready"}),
    ("/live", "get"): ("Liveness (open)", None, {200: "live"}),
    ("/metrics", "get"): ("Prometheus metrics (open)", None, {200: "text exposition format"}),
    ("/openapi.json", "get"): ("This document (open)", None, {200: "OpenAPI 3.1"}),
    ("/", "get"): ("The chat page, HTML (open; its questions go to /query)", None, {200: "the page"}),
    ("/chat/{name}", "get"): ("The chat page's chat.js or chat.css (open)", None, {200: "the file", 404: "no such file"}),
    ("/settings", "get"): ("Effective settings, secrets hidden (loopback, or with X-Cluster-Token)", None,
                           {200: "the settings", 403: "neither on loopback nor with the cluster token"}),
    ("/cache/clear", "post"): ("Clear the caches" + TOKEN, None, {200: "cleared", 401: "wrong cluster token"}),
    ("/data", "get"): ("This node's data versions: the current one and those held, with requests in flight" + TOKEN,
                       None, {200: "the versions", 401: "wrong cluster token"}),
    ("/data/load", "post"): ("Hold a data version beside the current one (docs/scaling.md, Data versions)" + TOKEN,
                             VERSION_BODY, {200: DONE, 400: "bad version", 401: "wrong cluster token",
                                            409: "incomplete, or built by another embedder"}),
    ("/data/switch", "post"): ("New requests read this data version" + TOKEN, VERSION_BODY,
                               {200: DONE, 400: "bad version", 401: "wrong cluster token", 503: "not held here"}),
    ("/data/release", "post"): ("Release a data version once its requests in flight end" + TOKEN, VERSION_BODY,
                                {200: DONE, 400: "bad version", 401: "wrong cluster token",
                                 409: "it is the current version", 503: "requests still use it: ask again"}),
}


class _NoFieldTitles(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def component_schemas() -> dict[str, Any]:
    """Every model's JSON Schema by name, references as #/components/schemas/<name>."""
    models: set[type[BaseModel]] = {OpenAIError, ServiceError}
    models.update(STREAMED.values())
    for _summary, request, reply, _what, _errors in PUBLIC.values():
        models.add(reply)
        models.update(getattr(request, "__args__", (request,)) if request is not None else ())
    keyed = [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)]
    _refs, schemas = models_json_schema(keyed, ref_template=REF, schema_generator=_NoFieldTitles)  # type: ignore[arg-type]
    defs = schemas["$defs"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        defs[name] = with_no_ops(defs[name])
    return {**defs, "TokenizeRequest": request_schema(es.TokenizeRequest)}


def with_no_ops(schema: dict[str, Any]) -> dict[str, Any]:
    """A generating route's schema closed, with the fields it accepts only at a no-op value (null: not sent)."""
    no_ops = {key: {"enum": [*values, None], "description": f"accepted only so: {why}"}
              for key, (values, why) in NO_OP.items()}
    return {**schema, "properties": {**schema["properties"], **no_ops}, "additionalProperties": False}


def request_schema(request: Any) -> dict[str, Any]:
    """A request body's schema (a model or a union of models), its models referred to in components."""
    schema = TypeAdapter(request).json_schema(ref_template=REF, schema_generator=_NoFieldTitles)
    return {key: value for key, value in schema.items() if key != "$defs"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _ref(model: Any) -> dict[str, Any]:
    name = "TokenizeRequest" if model is es.TokenizeRequest else model.__name__
    return {"$ref": REF.format(model=name)}


def _public(path: str, method: str, summary: str, request: Any, reply: type[BaseModel], what: str,
            errors: tuple[int, ...]) -> dict[str, Any]:
    error = ServiceError if path == "/query" else OpenAIError
    op: dict[str, Any] = {"summary": summary, "security": [{"bearerAuth": []}]}
    if "{model_id}" in path:
        op["parameters"] = [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    if request is not None:
        op["requestBody"] = {"required": True, "content": _json(_ref(request))}
    content = _json(_ref(reply))
    if (path, method) in STREAMED:
        content["text/event-stream"] = {"schema": _ref(STREAMED[path, method])}
    op["responses"] = {"200": {"description": what, "content": content},
                       **{str(s): {"description": ERRORS[s], "content": _json(_ref(error))} for s in errors}}
    return op


def _other(summary: str, body: dict[str, Any] | None, answers: dict[int, str]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(body)}
    op["responses"] = {str(status): {"description": what} for status, what in answers.items()}
    return op


@cache
def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for (path, method), (summary, request, reply, what, errors) in PUBLIC.items():
        paths.setdefault(path, {})[method] = _public(path, method, summary, request, reply, what, errors)
    for (path, method), (summary, body, answers) in OTHERS.items():
        paths.setdefault(path, {})[method] = _other(summary, body, answers)
    return {"openapi": "3.1.0", "info": INFO, "paths": paths, "components": {
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}, "schemas": component_schemas()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", metavar="PATH", help="write the document to PATH instead of printing it")
    args = parser.parse_args()
    text = json.dumps(openapi_document(), indent=1) + "\n"
    if args.write:
        with open(args.write, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
