"""Log probabilities on /v1/chat/completions and /v1/completions: the body's fields read, and the
worker's per-token log probabilities (its reply's `logprobs`: OpenAI's `content` items, computed by
the engine from its own logits, pipeline/continuous/sampling.py) in each route's shape.

A chat asks with `logprobs: true` and `top_logprobs` (0 to 20 alternatives per token; only with
`logprobs` true, as OpenAI's); a completion with `logprobs` (0 to 20, as vLLM; OpenAI's legacy
route allows 5). A chat's choice gets `{"content": [...], "refusal": null}`; a completion's the
legacy `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`. A stream carries them chunk by
chunk, each with the tokens its piece of text came from (the pieces are cut by the detokenizer and
the stop strings: a piece may hold several tokens; the tokens that gave no text, a stop string's or
an end-of-sequence token, come with the last choice chunk).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.sampling_params import MAX_TOP_LOGPROBS
from services.server.errors import ApiError

FIELD = "logprobs"  # the service's reply field and request field


def _count(value: object, field: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'{field}' must be an integer from 0 to {MAX_TOP_LOGPROBS}", field=field)
    return value


def chat_logprobs(fields: Mapping[str, Any]) -> int | None:
    """A chat body's ask: None (no log probabilities) or how many alternatives per token."""
    asked, top = fields.get("logprobs"), fields.get("top_logprobs")
    if asked is not None and type(asked) is not bool:
        raise ApiError(400, "'logprobs' must be true or false", field="logprobs")
    if top is not None and not asked:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", field="top_logprobs")
    return (0 if top is None else _count(top, "top_logprobs")) if asked else None


def text_logprobs(fields: Mapping[str, Any]) -> int | None:
    """A completion body's ask: None, or how many alternatives per token (`logprobs`)."""
    value = fields.get("logprobs")
    return None if value is None else _count(value, "logprobs")


def chat_choice_logprobs(content: Sequence[dict[str, Any]] | None) -> dict[str, Any] | None:
    """A chat choice's (or chunk's) `logprobs` of these tokens (OpenAI's content items): null where none."""
    return {"content": list(content), "refusal": None} if content is not None else None


def text_choice_logprobs(content: Sequence[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
    """A completion choice's (or chunk's) legacy `logprobs`: the tokens, their log probabilities, each
    one's alternatives by text, and where each token starts in the text (the first at `offset`)."""
    if content is None:
        return None
    offsets, at = [], offset
    for item in content:
        offsets.append(at)
        at += len(item["token"])
    return {"tokens": [item["token"] for item in content], "token_logprobs": [item["logprob"] for item in content],
            "top_logprobs": [{top["token"]: top["logprob"] for top in item["top_logprobs"]} for item in content],
            "text_offset": offsets}
