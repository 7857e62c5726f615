"""CORS for browser front-ends: off unless CORS_ALLOWED_ORIGINS names origins (or *). A preflight
is answered here (204, or 403 for another origin) before any API-key check: it carries no credentials.
"""
from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response, jsonify, request

ALLOWED_METHODS = "GET, POST, OPTIONS"
EXPOSED_HEADERS = "X-Request-ID, Retry-After, x-should-retry"
PREFLIGHT_MAX_AGE_S = 600


def install_cors(app: Flask, origins: tuple[str, ...], public: Callable[[str], bool]) -> None:
    if not origins:
        return
    any_origin = "*" in origins

    def allowed(origin: str) -> bool:
        return any_origin or origin.rstrip("/") in origins

    @app.before_request
    def _preflight():
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers \
                or not public(request.path):
            return None
        origin = request.headers.get("Origin", "")
        if not allowed(origin):
            response = jsonify({"error": f"origin {origin!r} is not allowed (CORS_ALLOWED_ORIGINS)"})
            response.status_code = 403
            return response
        response = Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        requested = request.headers.get("Access-Control-Request-Headers")
        if requested:
            response.headers["Access-Control-Allow-Headers"] = requested
        response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        return response

    @app.after_request
    def _allow_origin(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if origin and public(request.path) and allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = "*" if any_origin else origin
            if not any_origin:
                response.headers.add("Vary", "Origin")
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        return response
