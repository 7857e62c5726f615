"""The one request object every route makes and every layer passes down, and the one parser of it.

/query, /v1/chat/completions (its body translated first by services/roles/gateway/openai_api.py)
and a worker's /internal/answer each turn their body into an AnswerRequest with `read_request`,
by the same rules; a field refused is an ApiError 400 naming the field and the rule it broke.

To add a field: give AnswerRequest the field with its default and RULES its rule. It is then
read from the bodies of the routes that accept it and sent on to the worker (`wire`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import spec
from pipeline.config.sections import LimitsSettings
from services.server.body import require_string
from services.server.errors import ApiError
from services.server.request_ids import bind_request_id


@dataclass(frozen=True)
class AnswerRequest:
    """One request for an answer, whichever route it came by."""
    request_id: str  # the idempotency key: an id is answered once, with one answer
    query: str
    max_new_tokens: int | None = None  # a cap under the contract's MAX_NEW_TOKENS; None: the contract's answer
    stream: bool = False  # the caller reads the text pieces as they come (else the reply is collected)

    def wire(self) -> dict[str, Any]:
        """The body fields a worker is sent: those not at their default."""
        return {f.name: value for f in dataclasses.fields(self) if (value := getattr(self, f.name)) != f.default}


@dataclass(frozen=True)
class Bounds:
    """What the rules check against: the LIMITS settings, and the LLM tokenizer's count of a text."""
    limits: LimitsSettings
    count_tokens: Callable[[str], int]


def _request_id(body: Mapping[str, Any], bounds: Bounds) -> str:
    """Bound to the request at once (the X-Request-ID default), so a refusal of a later field names it."""
    request_id = require_string(body, "request_id", bounds.limits.max_request_id_chars)
    bind_request_id(request_id)
    return request_id


def _query(body: Mapping[str, Any], bounds: Bounds) -> str:
    """Bounded in characters (cheap, first), then in the LLM tokenizer's tokens: the tokens bound the
    prompt, its KV reservation and its prefill, which characters do not (an emoji is four tokens)."""
    query = require_string(body, "query", bounds.limits.max_query_chars)
    tokens, limit = bounds.count_tokens(query), bounds.limits.max_query_tokens
    if tokens > limit:
        raise ApiError(400, f"'query' is {tokens} tokens; the limit is {limit} tokens "
                            "(MAX_QUERY_TOKENS, counted by the LLM's tokenizer)", field="query")
    return query


def _max_new_tokens(body: Mapping[str, Any], bounds: Bounds) -> int | None:
    value = body.get("max_new_tokens")
    if value is not None and (type(value) is not int or not 1 <= value <= spec.MAX_NEW_TOKENS):
        raise ApiError(400, f"'max_new_tokens' must be an integer from 1 to {spec.MAX_NEW_TOKENS}",
                       field="max_new_tokens")
    return value


def _stream(body: Mapping[str, Any], bounds: Bounds) -> bool:
    value = body.get("stream", False)
    if type(value) is not bool:
        raise ApiError(400, "'stream' must be true or false", field="stream")
    return value


# Each field's rule, in the order they are checked (request_id first: it names the request).
RULES: dict[str, Callable[[Mapping[str, Any], Bounds], Any]] = {
    "request_id": _request_id, "query": _query, "max_new_tokens": _max_new_tokens, "stream": _stream}
ALL_FIELDS: tuple[str, ...] = tuple(RULES)


def read_request(body: Mapping[str, Any], bounds: Bounds, accepted: Collection[str] = ALL_FIELDS) -> AnswerRequest:
    """The request a body asks for. Fields outside `accepted` keep their default (a route ignores
    what it does not offer, as it ignores unknown fields)."""
    return AnswerRequest(**{name: rule(body, bounds) for name, rule in RULES.items() if name in accepted})
