"""Every error under /v1/ in OpenAI's shape, with the `x-should-retry` header the SDKs read.

The app's one error handler (services/server/app.py) answers every node's errors as
{"error": "<message>", "field": ...}; under /v1/ this after-request hook rewrites such a body
(a 404 for an unknown path, a 405, a 413 for a body over the limit, a 401 from the API keys) as
OpenAI's {"error": {message, type, param, code}}, keeping its status and Retry-After. The routes'
own OpenAI-shaped errors pass unchanged. `x-should-retry: false` on every 4xx but 429 (a 409 for
a reused request_id included: retrying the same body cannot succeed), true on 429 and the 5xx.
"""
from __future__ import annotations

import json

from flask import Flask, Response, request

from services.roles.gateway.openai_api import error_from_http

PREFIX = "/v1/"
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


def should_retry(status: int) -> bool:
    return status in RETRYABLE


def install_openai_errors(app: Flask) -> None:
    @app.after_request
    def _openai_shape(response: Response) -> Response:
        if not (request.path + "/").startswith(PREFIX) or response.status_code < 400:
            return response
        body = response.get_json(silent=True) if response.is_json and not response.is_streamed else None
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            error = error_from_http(response.status_code, body["error"], body.get("field"))
            response.set_data(json.dumps(error.body()))
            response.mimetype = "application/json"
        response.headers["x-should-retry"] = "true" if should_retry(response.status_code) else "false"
        return response
