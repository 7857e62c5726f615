"""The OpenAI-compatible API's translation: request bodies in, response objects out; no HTTP.

`parse_chat_request` (/v1/chat/completions) and `parse_text_request` (/v1/completions) turn a body
into a `V1Request`, or raise an ApiError naming the field. What is refused, never ignored:

- Every body field is in `FIELDS` (read), `NO_OP` (accepted only at a value that asks for what the
  service does anyway: `n` 1, `min_p` 0, `logprobs` false ...) or `IGNORED` (accepted and not acted
  on: `user`, an end-user id for the caller's own abuse tracking). Any other field is a 400 naming it:
  vLLM's extras (`repetition_penalty`, `guided_json`, `min_tokens` ...), `logit_bias`, structured
  output, tools, log probabilities. A field sent as null counts as not sent.
- The prompt is the contract's (pipeline/spec.py): its fixed system message, then the documents found
  for the question and the question. So a chat is one question: `messages` is the user's question,
  optionally after a system (or developer) message whose content is exactly the contract's system
  prompt. Any other system message, and any earlier turn, is a 400 naming that message: the service
  would not act on it, and does not drop it in silence. /v1/completions' `prompt` is the question.
- The decoding fields (temperature, top_p, top_k, seed, stop) pass on to the service's own rules
  (services/server/answer_request.py); `max_tokens` is clamped to OPENAI_MAX_TOKENS_CAP.

Replies and stream chunks carry the sentiment and toxicity in an extra top-level `rag` field that
OpenAI clients ignore, and a sampled answer's seed in a `seed` field.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipeline import spec
from services.server.errors import ApiError

DONE = "[DONE]"  # the data of the last event of a stream
RAG_FIELDS = ("sentiment", "is_toxic", "request_id")  # what the extra `rag` field holds
FinishReason = Literal["stop", "length"]
# The decoding fields the service's own rules read (services/server/answer_request.py).
SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop")
# The fields each route reads.
FIELDS = {
    "chat": ("model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "request_id",
             *SAMPLING),
    "text": ("model", "prompt", "stream", "stream_options", "max_tokens", "request_id", *SAMPLING),
}
_PENALTY = "the model's own repetition penalty (its generation config) applies to every answer"
_ONE = "the service returns one choice"
# Fields accepted only at the value that asks for what the service does anyway: (the values, why).
NO_OP: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), _ONE), "best_of": ((1,), _ONE), "use_beam_search": ((False,), _ONE),
    "presence_penalty": ((0,), _PENALTY), "frequency_penalty": ((0,), _PENALTY),
    "min_p": ((0,), "sampling uses temperature, top_p and top_k only"),
    "logprobs": ((False,), "the service returns no log probabilities"),
    "echo": ((False,), "the answer does not repeat the prompt"),
    "logit_bias": (({},), "the service does not bias tokens"),
    "tools": (([],), "the service does not call tools"), "functions": (([],), "the service does not call tools"),
    "tool_choice": (("none",), "the service does not call tools"),
    "function_call": (("none",), "the service does not call tools"),
    "response_format": (({"type": "text"},), "the answer is text from the fixed RAG prompt"),
    "modalities": ((["text"],), "the answer is text"),
    "store": ((False,), "the service stores no completions"),
    "min_tokens": ((0,), "an answer ends where the model ends it"),
    "ignore_eos": ((False,), "an answer ends where the model ends it"),
    "skip_special_tokens": ((True,), "special tokens are never in the answer"),
    "include_stop_str_in_output": ((False,), "a stop string is never in the answer"),
}
# Fields accepted and not acted on: nothing the caller asks for goes undone.
IGNORED = {"user": "an end-user id for the caller's own abuse tracking"}
# The message roles that carry a system prompt.
SYSTEM_ROLES = ("system", "developer")


def _invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, field=param, code=code)


def _unsupported_value(param: str, value: object, allowed: str) -> ApiError:
    return _invalid(f"'{param}' = {value!r} is not supported: {allowed}", param, "unsupported_value")


# ---------------------------------------------------------------- requests

@dataclass(frozen=True)
class V1Request:
    """What the service computes for one /v1 completion request."""
    query: str  # the question: the chat's user message, or the completion's prompt
    max_tokens: int  # new tokens at most: the request's, or the default, within the service's limit
    stream: bool
    request_id: str | None  # the body's `request_id` extension field (the idempotency key), if sent
    include_usage: bool  # stream_options.include_usage: a usage chunk before [DONE]
    sampling: Mapping[str, Any]  # the SAMPLING fields sent, for the service's rules to check


def parse_chat_request(body: object, *, max_tokens_limit: int, model_id: str,
                       default_max_tokens: int | None = None) -> V1Request:
    """A chat completions body as a V1Request, or the ApiError (400, 404) that says what is wrong."""
    fields = _fields(body, "chat", model_id)
    return _request(fields, _chat_query(fields.get("messages")), max_tokens_limit, default_max_tokens)


def parse_text_request(body: object, *, max_tokens_limit: int, model_id: str,
                       default_max_tokens: int | None = None) -> V1Request:
    """A (legacy) completions body as a V1Request: its prompt is the question."""
    fields = _fields(body, "text", model_id)
    return _request(fields, _prompt(fields.get("prompt")), max_tokens_limit, default_max_tokens)


def _fields(body: object, route: str, model_id: str) -> dict[str, Any]:
    """The body's fields sent (not null), each read, a no-op or ignored; else a 400 naming it."""
    if not isinstance(body, dict):
        raise _invalid(f"the body must be a JSON object, got {type(body).__name__}", None)
    fields = {key: value for key, value in body.items() if value is not None}
    model = fields.get("model")
    if model is None:
        raise _invalid("you must provide a model parameter", "model")
    if not isinstance(model, str):
        raise _invalid(f"'model' must be a string, got {type(model).__name__}", "model")
    if model != model_id:
        raise ApiError(404, f"The model `{model}` does not exist or you do not have access to it; "
                            f"this service serves `{model_id}`", field="model", code="model_not_found")
    for key, value in fields.items():
        if key in FIELDS[route] or key in IGNORED:
            continue
        if key not in NO_OP:
            raise _invalid(f"'{key}' is not supported: the service refuses what it would not act on; it reads "
                           f"{', '.join(FIELDS[route])} and ignores only {', '.join(IGNORED)}", key,
                           "unsupported_parameter")
        values, why = NO_OP[key]
        if not any(_same(value, v) for v in values):
            raise _unsupported_value(key, value, f"{why}; send {values[0]!r} or leave it out")
    return fields


def _same(value: object, allowed: object) -> bool:
    """Equal, as JSON means it: 0 and 0.0 are one number; false is no number."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, allowed))
    return value == allowed and (numbers or type(value) is type(allowed))


def _request(fields: dict[str, Any], query: str, limit: int, default: int | None) -> V1Request:
    stream = _optional_bool(fields, "stream")
    options = fields.get("stream_options")
    if options is not None and not stream:
        raise _invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    request_id = fields.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id.strip()):
        raise _invalid("'request_id' must be a non-empty string", "request_id")
    return V1Request(query=query, max_tokens=_max_tokens(fields, limit, limit if default is None else default),
                     stream=stream, request_id=request_id,
                     include_usage=_optional_bool(options or {}, "include_usage", "stream_options.include_usage"),
                     sampling={key: fields[key] for key in SAMPLING if key in fields})


def _optional_bool(source: dict, key: str, param: str | None = None) -> bool:
    value = source.get(key)
    if value is not None and not isinstance(value, bool):
        raise _invalid(f"'{param or key}' must be a boolean, got {type(value).__name__}", param or key)
    return bool(value)


def _max_tokens(fields: dict, limit: int, default: int) -> int:
    """The request's cap on new tokens, clamped to the service's `limit`; `default` when it sends none."""
    values = [_token_cap(fields, key) for key in ("max_completion_tokens", "max_tokens")]
    given = [v for v in values if v is not None]
    if len(set(given)) > 1:
        raise _invalid("'max_tokens' and 'max_completion_tokens' differ; send one of them", "max_tokens")
    return min(given[0] if given else default, limit)


def _token_cap(fields: dict, key: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"'{key}' must be an integer, got {type(value).__name__}", key)
    if value < 1:
        raise _invalid(f"'{key}' is {value}; it must be at least 1", key, "invalid_value")
    return value


def _chat_query(messages: object) -> str:
    """The question: the one user message, after at most the contract's own system message."""
    if messages is None:
        raise _invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
        extra = [key for key, value in message.items() if key not in ("role", "content") and value is not None]
        if extra:
            raise _invalid(f"'messages[{i}].{extra[0]}' is not supported: a message is its role and content",
                           f"messages[{i}].{extra[0]}", "unsupported_parameter")
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise _invalid(f"the last message must have role 'user' (it is the question), got {messages[last]['role']!r}",
                       f"messages[{last}].role")
    for i, message in enumerate(messages[:last]):
        if i == 0 and message["role"] in SYSTEM_ROLES:
            if _text(message.get("content"), "messages[0].content") != spec.SYSTEM_PROMPT:
                raise _invalid("a system message is not supported: the service's prompt is its fixed RAG prompt, "
                               f"whose system message is {spec.SYSTEM_PROMPT!r}; send that or none",
                               "messages[0]", "unsupported_value")
            continue
        raise _invalid(f"earlier turns are not supported: the service answers one question from its documents; "
                       f"send the question as the only user message (messages[{i}] is a {message['role']!r} "
                       "message before it)", f"messages[{i}]", "unsupported_value")
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


def _prompt(prompt: object) -> str:
    """The completion's prompt: a string, or an array of one string (more would be more answers)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise _invalid("'prompt' is required", "prompt")
    if not isinstance(prompt, str):
        raise _invalid("'prompt' must be a string (one question; token arrays and several prompts are not "
                       "supported)", "prompt", "unsupported_value")
    return prompt


# ---------------------------------------------------------------- responses

def completion_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


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


def text_completion(id: str, created: int, model: str, reply: Mapping[str, Any]) -> dict[str, Any]:
    """A `text_completion` object of the service's reply."""
    finish_reason = reply.get("finish_reason", "stop")
    _check_finish_reason(finish_reason)
    return {"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": reply["generated_response"], "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage(*usage_counts(reply)), "rag": rag_fields(reply), **seed_field(reply)}


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


def text_chunks(id: str, created: int, model: str, events: Iterable[str | dict], *,
                include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """An answer stream as `text_completion` chunks: one per piece, the last with why the answer
    ended (and the `rag` and `seed` fields), then with include_usage one with no choices and the usage."""
    def text_chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
        obj = {"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
        return {**obj, "usage": None} if include_usage else obj

    for event in events:
        if isinstance(event, str):
            yield text_chunk(event, None)
            continue
        reason = event.get("finish_reason", "stop")
        _check_finish_reason(reason)
        yield {**text_chunk("", reason), "rag": rag_fields(event), **seed_field(event)}
        if include_usage:
            yield {"id": id, "object": "text_completion", "created": created, "model": model, "choices": [],
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
