"""The OpenAI-compatible API's translation: request bodies in, response objects out; no HTTP.

`parse_chat_request` turns a chat completions body into a `ChatRequest` (the last user message is
the query: the contract's prompt is fixed) or raises an `OpenAIError`. Parameters that would change
the answer and cannot be honoured (n > 1, tools, logprobs, structured output) are a 400 naming
them; unknown fields are ignored, as OpenAI's servers do. Replies and stream chunks carry the
sentiment and toxicity in an extra top-level `rag` field that OpenAI clients ignore.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.server.openai_errors import error_kind

DONE = "[DONE]"  # the data of the last event of a stream
RAG_FIELDS = ("sentiment", "is_toxic", "request_id")  # what the extra `rag` field holds
FinishReason = Literal["stop", "length"]


class OpenAIError(Exception):
    """An error for an OpenAI client: its HTTP status and OpenAI's {message, type, param, code}."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        kind, default_code = error_kind(status)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or kind
        self.code = code if code is not None else default_code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _invalid(message: str, param: str | None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code=code)


def _unsupported(param: str, why: str) -> OpenAIError:
    return _invalid(f"'{param}' is not supported: {why}", param, "unsupported_parameter")


def _unsupported_value(param: str, value: object, allowed: str) -> OpenAIError:
    return _invalid(f"'{param}' = {value!r} is not supported: {allowed}", param, "unsupported_value")


# ---------------------------------------------------------------- requests

@dataclass(frozen=True)
class ChatRequest:
    """What the service computes for one chat completion request."""
    query: str  # the last user message's text
    max_tokens: int  # new tokens at most: the request's, or the service's limit
    stream: bool
    request_id: str | None  # the body's `request_id` extension field (the idempotency key), if sent
    include_usage: bool  # stream_options.include_usage: a usage chunk before [DONE]


def parse_chat_request(body: object, *, max_tokens_limit: int, model_id: str,
                       default_max_tokens: int | None = None) -> ChatRequest:
    """A chat completions body as a ChatRequest, or the OpenAIError (400, 404) that says what is wrong."""
    if not isinstance(body, dict):
        raise _invalid(f"the body must be a JSON object, got {type(body).__name__}", None)
    model = body.get("model")
    if model is None:
        raise _invalid("you must provide a model parameter", "model")
    if not isinstance(model, str):
        raise _invalid(f"'model' must be a string, got {type(model).__name__}", "model")
    if model != model_id:
        raise OpenAIError(404, f"The model `{model}` does not exist or you do not have access to it; "
                               f"this service serves `{model_id}`", "model", code="model_not_found")
    _refuse_unsupported(body)
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise _invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    request_id = body.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id.strip()):
        raise _invalid("'request_id' must be a non-empty string", "request_id")
    default = max_tokens_limit if default_max_tokens is None else default_max_tokens
    return ChatRequest(query=_query(body.get("messages")), max_tokens=_max_tokens(body, max_tokens_limit, default),
                       stream=stream, request_id=request_id,
                       include_usage=_optional_bool(options or {}, "include_usage", "stream_options.include_usage"))


def _optional_bool(source: dict, key: str, param: str | None = None) -> bool:
    value = source.get(key)
    if value is not None and not isinstance(value, bool):
        raise _invalid(f"'{param or key}' must be a boolean, got {type(value).__name__}", param or key)
    return bool(value)


def _refuse_unsupported(body: dict) -> None:
    # Sampling and stop strings are the service's own request fields (services/server/answer_request.py).
    if body.get("n") not in (None, 1):
        raise _unsupported_value("n", body["n"], "this service returns one choice; send n = 1 or leave it out")
    for key in ("presence_penalty", "frequency_penalty"):
        # The model's own repetition penalty applies to every answer; an additive one on top of it
        # would be a second knob for the same thing.
        if body.get(key) not in (None, 0):
            raise _unsupported_value(key, body[key], "the model's own repetition penalty applies to every "
                                                     "answer; send 0 or leave it out")
    for key in ("tools", "functions", "logit_bias", "audio", "prediction"):
        if body.get(key):  # an empty list or object asks for nothing
            raise _unsupported(key, "this service answers with text from its fixed RAG prompt only")
    for key in ("tool_choice", "function_call"):
        if body.get(key) not in (None, "none"):
            raise _unsupported(key, "this service does not call tools")
    if body.get("logprobs") or body.get("top_logprobs"):
        key = "logprobs" if body.get("logprobs") else "top_logprobs"
        raise _unsupported(key, "this service does not return log probabilities")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _unsupported("response_format", "only {'type': 'text'} is")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _unsupported_value("modalities", modalities, "only ['text'] is")


def _max_tokens(body: dict, limit: int, default: int) -> int:
    """The request's cap on new tokens, clamped to the service's `limit`; `default` when it sends none."""
    values = [_token_cap(body, key) for key in ("max_completion_tokens", "max_tokens")]
    given = [v for v in values if v is not None]
    if len(set(given)) > 1:
        raise _invalid("'max_tokens' and 'max_completion_tokens' differ; send one of them", "max_tokens")
    return min(given[0] if given else default, limit)


def _token_cap(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"'{key}' must be an integer, got {type(value).__name__}", key)
    if value < 1:
        raise _invalid(f"'{key}' is {value}; it must be at least 1", key, "invalid_value")
    return value


def _query(messages: object) -> str:
    if messages is None:
        raise _invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise _invalid(f"the last message must have role 'user' (it is the query), got {messages[last]['role']!r}",
                       f"messages[{last}].role")
    query = _text(messages[last].get("content"), f"messages[{last}].content")
    if not query.strip():
        raise _invalid("the last user message must not be empty", f"messages[{last}].content")
    return query


def _text(content: object, param: str) -> str:
    """A message's content as text: a string, or a list of text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or an array of text parts", param)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _unsupported_value(f"{param}[{i}]", kind, "only text parts ({'type': 'text', 'text': ...}) are")
        texts.append(part["text"])
    return "\n".join(texts)


# ---------------------------------------------------------------- responses

def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def rag_fields(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The extra `rag` field: sentiment, is_toxic and request_id from the service's reply."""
    # The data version that answered (services/roles/worker/request_path.py), where the reply names one.
    return {key: extra[key] for key in (*RAG_FIELDS, "data_version") if key in extra or key in RAG_FIELDS}


def completion(id: str, created: int, model: str, text: str, prompt_tokens: int, completion_tokens: int,
               extra: Mapping[str, Any], *, finish_reason: FinishReason = "stop") -> dict[str, Any]:
    """A `chat.completion` object; `extra` is the service's reply (its RAG_FIELDS go into `rag`)."""
    _check_finish_reason(finish_reason)
    return {
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens),
        "rag": rag_fields(extra),
    }


def chunk(id: str, created: int, model: str, delta: Mapping[str, Any], finish_reason: FinishReason | None = None,
          *, include_usage: bool = False, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `chat.completion.chunk` with one choice; `usage: null` with include_usage (as OpenAI's)."""
    if finish_reason is not None:
        _check_finish_reason(finish_reason)
    obj: dict[str, Any] = {
        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        obj["usage"] = None
    if extra is not None:
        obj["rag"] = rag_fields(extra)
    return obj


def stream_chunks(id: str, created: int, model: str, events: Iterable[str | dict], *,
                  include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """An answer stream (text pieces, then the service's reply) as chunks: the assistant's role and
    empty content, one per piece, the last choice chunk (an empty delta, why the answer ended, the
    `rag` field and a sampled answer's `seed`), then with include_usage one with no choices and the usage."""
    yield chunk(id, created, model, {"role": "assistant", "content": ""}, include_usage=include_usage)
    for event in events:
        if isinstance(event, str):
            yield chunk(id, created, model, {"content": event}, include_usage=include_usage)
            continue
        yield {**chunk(id, created, model, {}, event.get("finish_reason", "stop"), include_usage=include_usage,
                       extra=event), **seed_field(event)}
        if include_usage:
            yield {"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                   "usage": usage(*usage_counts(event))}


def usage_counts(reply: Mapping[str, Any]) -> tuple[int, int]:
    """The prompt and completion tokens of the service's reply."""
    counts = reply.get("usage") or {}
    return int(counts.get("prompt_tokens", 0)), int(counts.get("completion_tokens", 0))


def seed_field(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The `seed` extension field of a sampled answer: the seed that gives it again."""
    return {"seed": reply["seed"]} if "seed" in reply else {}


def _check_finish_reason(reason: str) -> None:
    if reason not in ("stop", "length"):
        raise ValueError(f"finish_reason is 'stop' or 'length', got {reason!r}")
