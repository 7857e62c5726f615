"""What node 0's public endpoints get beyond their routes: API keys, CORS, OpenAI-shaped /v1 errors,
/v1/embeddings, and the static /openapi.json that describes them.

Public paths are /query and everything under /v1/: API keys and CORS apply to them alone, so
/health, /ready, /live, /metrics and /openapi.json stay open (as vLLM's do).
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from flask import Flask, Response, jsonify

from pipeline.config.sections import ApiSettings
from services.roles.gateway.front import Front
from services.roles.gateway.openai_api import OpenAIError
from services.roles.gateway.openai_embeddings import register_openai_embeddings
from services.roles.loaded import Loaded
from services.roles.worker.request_path import Worker
from services.server.auth import ApiKeys, install_api_keys
from services.server.cors import install_cors
from services.server.openai_errors import install_openai_errors

OPENAPI_FILE = Path(__file__).with_name("openapi.json")


def is_public(path: str) -> bool:
    return path == "/query" or path == "/v1" or path.startswith("/v1/")


@cache
def openapi_document() -> dict[str, Any]:
    return json.loads(OPENAPI_FILE.read_text(encoding="utf-8"))


def register_public_api(app: Flask, api: ApiSettings, front: Front, worker: Loaded[Worker]) -> None:
    install_cors(app, api.cors_allowed_origins, is_public)  # first: a preflight is answered before any key check
    if api.api_keys_file is not None:
        install_api_keys(app, ApiKeys.from_file(api.api_keys_file), is_public)
    install_openai_errors(app)  # every other error under /v1/ takes OpenAI's shape there

    @app.errorhandler(OpenAIError)
    def openai_error(error: OpenAIError) -> Response:  # a /v1 body refused, in OpenAI's shape already
        response = jsonify(error.body())
        response.status_code = error.status
        return response

    register_openai_embeddings(app, front, worker)

    @app.get("/openapi.json")
    def openapi():
        return jsonify(openapi_document())
