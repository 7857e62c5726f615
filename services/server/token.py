"""The cluster token: internal endpoints answer only callers that send the shared secret."""
from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
from typing import Callable

from flask import request

from services.server.errors import ApiError

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Cluster-Token"
# Paths under this prefix are internal on every node, served or not: without the token a caller
# learns nothing (401), not even which node serves them.
INTERNAL_PREFIX = "/internal/"


def require_cluster_token(expected: str) -> None:
    """401 unless the caller sent the cluster's shared token (no check when none is configured)."""
    if not expected:
        return
    if not token_matches(request.headers.get(TOKEN_HEADER, ""), expected):
        raise token_refused()


def token_matches(sent: str, expected: str) -> bool:
    # Headers are latin-1 strings; compare bytes in constant time so timing leaks nothing.
    return hmac.compare_digest(sent.encode("latin-1", "replace"), expected.encode("ascii"))


def token_refused() -> ApiError:
    return ApiError(401, f"missing or wrong {TOKEN_HEADER}: this endpoint is for cluster nodes only",
                    field=TOKEN_HEADER)


def internal_endpoint(token: str) -> Callable:
    """Decorator for node-to-node endpoints: the token is checked before anything else.

    serve() also checks it as soon as the request's headers are in (HeaderGate), before
    waitress reads the body; this check stays for servers other than ours (tests' clients).
    """
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(*args, **kwargs):
            require_cluster_token(token)
            return view(*args, **kwargs)
        checked.__dict__["cluster_internal"] = True  # header_gate finds the internal routes by it
        return checked
    return wrap


def warn_if_exposed(host: str, token: str) -> bool:
    """Log loudly when a node listens beyond loopback with no cluster token; True if it did."""
    if token:
        return False
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        loopback = host == "localhost"
    if not loopback:
        log.warning("SECURITY: listening on %s with no CLUSTER_TOKEN: anyone who can reach this address can "
                    "call the internal endpoints (/search, /internal/answer, /cache/clear); set CLUSTER_TOKEN "
                    "on every node or keep the nodes behind a firewall", host)
    return not loopback

