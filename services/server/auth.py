"""API keys for the public endpoints: `Authorization: Bearer <key>` checked against API_KEYS_FILE
(a key a line, or `sha256:<64 hex digits>`; `#` comments). Keys are kept only as SHA-256 digests,
compared with every one in constant time; no key is ever logged.

An authenticated request's caller is its key's identity (`sha256:<hex digest>`, never the key):
the gateway scopes request ids and replies to it, so one key never sees another's requests.
Without API keys every request's caller is None.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path

from flask import Flask, g, has_request_context, request

from services.server.errors import ApiError

SHA256_PREFIX = "sha256:"


class ApiKeys:
    def __init__(self, digests: list[bytes]):
        if not digests:
            raise ValueError("no API keys")
        self._digests = tuple(digests)

    @classmethod
    def from_file(cls, path: Path) -> ApiKeys:
        """The keys of the file; ValueError (naming the line, never its text) where one is malformed."""
        digests = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if entry.startswith(SHA256_PREFIX):
                try:
                    digest = bytes.fromhex(entry[len(SHA256_PREFIX):])
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise ValueError(f"{path}:{number}: a sha256: entry needs 64 hex digits")
                digests.append(digest)
            else:
                digests.append(hashlib.sha256(entry.encode("utf-8")).digest())
        if not digests:
            raise ValueError(f"{path} holds no API keys")
        return cls(digests)

    def identify(self, key: str) -> str | None:
        """The key's identity (its digest's `sha256:` form), or None for a key not in the file."""
        digest = hashlib.sha256(key.encode("utf-8", "replace")).digest()
        matched = False
        for known in self._digests:  # every one, always: the time does not depend on which matched
            matched |= hmac.compare_digest(digest, known)
        return f"{SHA256_PREFIX}{digest.hex()}" if matched else None


def authenticated_caller() -> str | None:
    """The identity of the key the current HTTP request was let in with; None without API keys
    (or outside a request)."""
    return g.get("caller") if has_request_context() else None


def install_api_keys(app: Flask, keys: ApiKeys, protected: Callable[[str], bool]) -> None:
    """401 for a request to a protected path without a valid key; a CORS preflight (OPTIONS) carries
    no credentials and is let through to be answered."""
    @app.before_request
    def _require_api_key():
        if request.method == "OPTIONS" or not protected(request.path):
            return None
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")  # Bearer <key>
        caller = keys.identify(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if caller is None:
            raise ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           field="authorization")
        g.caller = caller
        return None
