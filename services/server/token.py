"""The cluster token: internal endpoints answer only callers that send the shared secret; operator
endpoints (/settings) answer those and callers on this machine."""
from __future__ import annotations

import functools
import hmac
import ipaddress
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



def is_loopback(address: str | None) -> bool:
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def operator_endpoint(token: str) -> Callable:
    """Decorator for what only the cluster's operators may read (a node's effective settings): answered
    to a caller on this machine (loopback), or to one that sends the cluster token; 403 to anyone else
    (with no token configured, to everyone off this machine)."""
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(*args, **kwargs):
            sent = request.headers.get(TOKEN_HEADER, "")
            if not is_loopback(request.remote_addr) and not (token and token_matches(sent, token)):
                raise ApiError(403, f"this endpoint answers only on this machine (loopback) or with the cluster's "
                                    f"{TOKEN_HEADER}", field=TOKEN_HEADER)
            return view(*args, **kwargs)
        return checked
    return wrap
