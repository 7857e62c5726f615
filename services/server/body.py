"""Request bodies: a JSON object within a size and value-count limit, and the string fields
/query and /internal/answer require. Each refusal is an ApiError naming the field and the rule."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flask import request

from services.server.errors import ApiError

DEFAULT_MAX_BODY_BYTES = 64 * 1024


def read_json_object(max_bytes: int = DEFAULT_MAX_BODY_BYTES, max_values: int | None = None) -> dict:
    """The request body as a JSON object, or an ApiError (415, 413, 400) saying why not.
    `max_values`: refuse a body that could hold more JSON values before parsing it (a 28 MiB body
    of "[0]," rows would cost json.loads over 700 MB and seconds of CPU)."""
    if request.mimetype != "application/json":
        raise ApiError(415, f"expected Content-Type application/json, got {request.mimetype or 'none'!r}",
                       field="Content-Type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise body_too_large(request.content_length, max_bytes)
    # Read at most one byte past the limit: a chunked body has no Content-Length to check first.
    raw = _read_at_most(request.stream, max_bytes + 1)
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is over the limit of {max_bytes} bytes", field="body")
    if max_values is not None:
        _check_value_count(raw, max_values)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", field="body") from None
    except RecursionError:  # "[[[[..." thousands deep: bad input, not our failure
        raise ApiError(400, "malformed JSON: nested too deeply", field="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object, got {type(body).__name__}", field="body")
    return body


def _check_value_count(raw: bytes, max_values: int) -> None:
    # Each value is an opened container or follows a comma, plus the root: an upper bound
    # (commas and brackets inside strings count too), in a few C-speed passes.
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if values > max_values:
        raise ApiError(400, f"the body holds up to {values} JSON values; the limit is {max_values}", field="body")


def body_too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"request body is {size} bytes; the limit is {limit}", field="body")


def _read_at_most(stream, limit: int) -> bytes:
    """Up to `limit` bytes; loops because a stream may return less than asked before its end."""
    parts, size = [], 0
    while size < limit:
        part = stream.read(limit - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def require_string(body: Mapping[str, Any], field: str, max_length: int) -> str:
    """body[field] as a non-empty string of at most max_length characters; unknown fields are ignored."""
    value = body.get(field)
    if value is None:
        raise ApiError(400, f"'{field}' is required", field=field)
    if not isinstance(value, str):
        raise ApiError(400, f"'{field}' must be a string, got {type(value).__name__}", field=field)
    if not value.strip():
        raise ApiError(400, f"'{field}' must not be empty", field=field)
    if len(value) > max_length:
        raise ApiError(400, f"'{field}' is {len(value)} characters; the limit is {max_length}", field=field)
    try:  # JSON can spell lone surrogates ("\ud800"); no tokenizer, log or reply could carry them
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{field}' must be valid Unicode text (it holds a lone surrogate)",
                       field=field) from None
    return value

