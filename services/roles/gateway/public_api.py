"""What node 0's public endpoints get beyond their routes: API keys, CORS, /v1/embeddings,
/v1/rerank and /v1/moderations (node 0's own worker's stages), and /openapi.json, built from the
routes' pydantic models (openapi.py). (Their errors take OpenAI's shape under /v1 by the one
table of error shapes, services/server/error_shapes.py.)

Public paths are /query, /tokenize, /detokenize and everything under /v1/: API keys and CORS apply to
them alone (the tokenizer's routes cost a slot as the others do), so
/health, /ready, /live, /metrics and /openapi.json stay open (as vLLM's do).
"""
from __future__ import annotations

from flask import Flask, jsonify

from pipeline.config.sections import ApiSettings
from services.roles.gateway.front import Front
from services.roles.gateway.openai_embeddings import EmbedderModel, register_openai_embeddings
from services.roles.gateway.openai_scoring import register_openai_scoring
from services.roles.gateway.openapi import openapi_document
from services.roles.worker.role import WorkerRole
from services.server.auth import ApiKeys, install_api_keys
from services.server.cors import install_cors


def is_public(path: str) -> bool:
    return path in ("/query", "/tokenize", "/detokenize", "/v1") or path.startswith("/v1/")


def register_public_api(app: Flask, api: ApiSettings, front: Front, worker: WorkerRole, node: int) -> None:
    install_cors(app, api.cors_allowed_origins, is_public)  # first: a preflight is answered before any key check
    if api.api_keys_file is not None:
        install_api_keys(app, ApiKeys.from_file(api.api_keys_file), is_public)
    embedder = EmbedderModel(worker.settings.embed.model, lambda: worker.worker.require().stages.embedder.dim)
    register_openai_embeddings(app, front, worker.embed, embedder, node)
    register_openai_scoring(app, front, lambda: worker.worker.require(), node)

    document = openapi_document()  # built at start-up: a model that cannot be described fails here

    @app.get("/openapi.json")
    def openapi():
        return jsonify(document)
