"""The OpenAI-compatible API's translation: request bodies in, response objects out; no HTTP.

`parse_chat_request` (/v1/chat/completions) and `parse_text_request` (/v1/completions) turn a body
into a `V1Request`, or raise an ApiError naming the field. What is refused, never ignored:

- Every body field is read, in `NO_OP` (accepted only at a value that asks for what the service does
  anyway: `n` 1, `min_p` 0, `logprobs` false ...) or in `IGNORED` (accepted, logged and not acted on,
  as none changes the answer: `user`, `metadata`, `service_tier` ...; so are `stream_options` keys
  but `include_usage`), by services/server/fields.py. Any other field is a 400 naming it: vLLM's
  extras (`repetition_penalty`, `guided_json`, `min_tokens` ...), `logit_bias`, structured output.
  A field sent as null counts as not sent. Log probabilities: openai_logprobs.py.
- A chat is a conversation (pipeline/conversation.py): the last message is the user's question; the
  user and assistant messages before it are its history, rendered by the model's chat template
  between the service's system prompt and the documents found with the question (the oldest dropped
  beyond MAX_HISTORY_TOKENS: `usage.history_turns_dropped`); system (or developer) messages are the
  client's instructions, added after the service's system prompt, never in its place (one that is
  exactly the contract's system prompt adds nothing). /v1/completions' `prompt` is the question.
- Tools (openai_tools.py): `tools` are rendered by Qwen2.5's chat template as `tool_choice` says, and
  the model's calls come back as `tool_calls` (`finish_reason` "tool_calls"), streamed as deltas: each
  call's name, then its arguments in pieces as the model writes them.
- The decoding fields (temperature, top_p, top_k, seed, stop) pass on to the service's own rules
  (services/server/answer_request.py); `max_tokens` is clamped to OPENAI_MAX_TOKENS_CAP.

The response objects: openai_responses.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.roles.gateway.openai_choices import read_n
from services.roles.gateway.openai_logprobs import (
    chat_logprobs,
    text_logprobs,
)
from services.roles.gateway.openai_messages import chat_conversation
from services.roles.gateway.openai_tools import shown_tools
from services.server.errors import ApiError
from services.server.fields import FieldRules

# The decoding fields the service's own rules read (services/server/answer_request.py).
SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop")
_PENALTY = "the model's own repetition penalty (its generation config) applies to every answer"
_ONE = "the service returns n choices, each its own answer"
# Fields accepted only at the value that asks for what the service does anyway: (the values, why).
NO_OP: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((1,), _ONE), "use_beam_search": ((False,), _ONE),
    "presence_penalty": ((0,), _PENALTY), "frequency_penalty": ((0,), _PENALTY),
    "min_p": ((0,), "sampling uses temperature, top_p and top_k only"),
    "echo": ((False,), "the answer does not repeat the prompt"),
    "logit_bias": (({},), "the service does not bias tokens"),
    "functions": (([],), "the deprecated functions are not read: send them as `tools`"),
    "function_call": (("none",), "the deprecated function_call is not read: send `tool_choice`"),
    "response_format": (({"type": "text"},), "the answer is text from the fixed RAG prompt"),
    "modalities": ((["text"],), "the answer is text"),
    "store": ((False,), "the service stores no completions"),
    "min_tokens": ((0,), "an answer ends where the model ends it"),
    "ignore_eos": ((False,), "an answer ends where the model ends it"),
    "skip_special_tokens": ((True,), "special tokens are never in the answer"),
    "include_stop_str_in_output": ((False,), "a stop string is never in the answer"),
}
# Fields accepted and not acted on, logged by name: none can change the answer.
IGNORED = {
    "user": "an end-user id for the caller's own abuse tracking",
    "safety_identifier": "an end-user id for the caller's own abuse tracking",
    "metadata": "the caller's tags for its own records; the service stores no completions",
    "service_tier": "one tier serves every request",
    "prompt_cache_key": "a hint for a prompt cache, which changes no answer",
}
# The fields each route reads, no-ops and ignores.
ROUTE_FIELDS = {
    "chat": FieldRules(("model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                        "request_id", "tools", "tool_choice", "logprobs", "top_logprobs", "n", "parallel_tool_calls",
                        *SAMPLING), NO_OP,
                       IGNORED),
    "text": FieldRules(("model", "prompt", "stream", "stream_options", "max_tokens", "request_id", "logprobs", "n",
                        *SAMPLING), NO_OP, IGNORED),
}
# stream_options: `include_usage` is read; the other keys (vLLM's `continuous_usage_stats`, OpenAI's
# `include_obfuscation` ...) shape the stream, never the answer: accepted, logged and not acted on.
STREAM_OPTIONS = FieldRules(("include_usage",), ignore_others=True)


def _invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, field=param, code=code)


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
    history: tuple[dict, ...] = ()  # the chat's earlier user, assistant and tool turns, oldest first
    instructions: str | None = None  # the chat's system messages, added after the service's system prompt
    tools: tuple[dict, ...] = ()  # the tools the model is shown (as tool_choice says)
    tool_round: tuple[dict, ...] = ()  # the assistant's calls and the tools' results after the question
    logprobs: int | None = None  # each token's log probability with this many alternatives; None: none
    n: int = 1  # choices: each its own answer (openai_choices.py)
    parallel_tool_calls: bool | None = None  # false: at most one tool call (the answer ends where it closes)


def parse_chat_request(body: object, *, max_tokens_limit: int, model_id: str,
                       default_max_tokens: int | None = None) -> V1Request:
    """A chat completions body as a V1Request, or the ApiError (400, 404) that says what is wrong."""
    fields = _fields(body, "chat", model_id)
    chat = chat_conversation(fields.get("messages"))
    return dataclasses.replace(_request(fields, chat.query, max_tokens_limit, default_max_tokens),
                               history=chat.history, instructions=chat.instructions, tool_round=chat.tool_round,
                               tools=shown_tools(fields.get("tools"), fields.get("tool_choice")),
                               logprobs=chat_logprobs(fields), parallel_tool_calls=fields.get("parallel_tool_calls"))


def parse_text_request(body: object, *, max_tokens_limit: int, model_id: str,
                       default_max_tokens: int | None = None) -> V1Request:
    """A (legacy) completions body as a V1Request: its prompt is the question."""
    fields = _fields(body, "text", model_id)
    return dataclasses.replace(_request(fields, _prompt(fields.get("prompt")), max_tokens_limit, default_max_tokens),
                               logprobs=text_logprobs(fields))


def _fields(body: object, route: str, model_id: str) -> dict[str, Any]:
    """The body's fields sent (not null), each read, a no-op or ignored; else a 400 naming it."""
    if not isinstance(body, dict):
        raise _invalid(f"the body must be a JSON object, got {type(body).__name__}", None)
    model = body.get("model")
    if model is None:
        raise _invalid("you must provide a model parameter", "model")
    if not isinstance(model, str):
        raise _invalid(f"'model' must be a string, got {type(model).__name__}", "model")
    if model != model_id:
        raise ApiError(404, f"The model `{model}` does not exist or you do not have access to it; "
                            f"this service serves `{model_id}`", field="model", code="model_not_found")
    return ROUTE_FIELDS[route].check(body)


def _request(fields: dict[str, Any], query: str, limit: int, default: int | None) -> V1Request:
    stream = _optional_bool(fields, "stream")
    options = fields.get("stream_options")
    if options is not None and not stream:
        raise _invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    if options is not None:
        STREAM_OPTIONS.check(options, "stream_options.")
    request_id = fields.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id.strip()):
        raise _invalid("'request_id' must be a non-empty string", "request_id")
    return V1Request(query=query, max_tokens=_max_tokens(fields, limit, limit if default is None else default),
                     stream=stream, request_id=request_id, n=read_n(fields),
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
