"""The cluster token: internal endpoints answer only callers that send the shared secret."""
from __future__ import annotations

import functools
import hmac
from typing import Callable

from flask import request

from services.server.errors import ApiError

TOKEN_HEADER = "X-Cluster-Token"
# Paths under this prefix are internal on every node, served or not: without the token a caller
# learns nothing (401), not even which node serves them.
INTERNAL_PREFIX = "/internal/"


def token_matches(sent: str, expected: str) -> bool:
    # Headers are latin-1 strings; compare bytes in constant time so timing leaks nothing.
    return hmac.compare_digest(sent.encode("latin-1", "replace"), expected.encode("ascii"))


def token_refused() -> ApiError:
    return ApiError(401, f"missing or wrong {TOKEN_HEADER}: this endpoint is for cluster nodes only",
                    field=TOKEN_HEADER)


def internal_endpoint(token: str) -> Callable:
    """Decorator for node-to-node endpoints: 401 unless the caller sent the cluster's shared token (no
    check when none is configured), before anything else (HeaderGate checks it earlier still, before
    waitress reads the body; this stays for other servers)."""
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(*args, **kwargs):
            if token and not token_matches(request.headers.get(TOKEN_HEADER, ""), token):
                raise token_refused()
            return view(*args, **kwargs)
        checked.__dict__["cluster_internal"] = True  # header_gate finds the internal routes by it
        return checked
    return wrap

