"""POST /tokenize and /detokenize as vLLM serves them, with the LLM's tokenizer, through the edge
(services/server/edge.py) and under a slot of GATEWAY_MAX_IN_FLIGHT, as /v1/embeddings is.

/tokenize takes a `prompt` (vLLM's TokenizeCompletionRequest) or chat `messages` (TokenizeChatRequest)
and answers `{count, max_model_len, tokens, token_strs: null}`. Client text never becomes control
tokens (pipeline/prompt_tokens.py): a prompt is encoded with every added-token string kept as text,
and messages are rendered by the model's chat template as the service renders a conversation
(`PromptTokenizer.chat_ids`), the assistant's turn opened after them. The messages are tokenized as
sent: a completion's prompt holds the service's system prompt and the retrieved passages besides,
so its `prompt_tokens` is more. Qwen2.5's tokenizer adds no special tokens around a text, so
`add_special_tokens` is read (a boolean) and changes nothing. /detokenize takes `tokens` and
answers `{prompt}`, the ids decoded with their control tokens written out, as vLLM does.

Bounds, as a /v1 request's: a prompt is a query (MAX_QUERY_CHARS, then MAX_QUERY_TOKENS); each
message's content is at most MAX_QUERY_CHARS, and the contents together at most MAX_QUERY_TOKENS +
MAX_HISTORY_TOKENS (a question and its conversation); /detokenize's ids are at most that plus
OPENAI_MAX_TOKENS_CAP (an answer). Errors are OpenAI's shape (services/server/error_shapes.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Flask

from pipeline import spec
from pipeline.prompt_tokens import PromptTokenizer
from services.roles.gateway.endpoint_schemas import DetokenizeResponse, TokenizeResponse
from services.roles.gateway.front import Front
from services.roles.gateway.openai_messages import SYSTEM_ROLES, TURN_ROLES, message_text
from services.server.answer import Computed
from services.server.answer_request import Bounds, check_text
from services.server.deadline import Deadline
from services.server.edge import Call
from services.server.errors import ApiError
from services.server.fields import FieldRules

MODEL_ID = spec.GENERATOR_MODEL
_NO_STRS = ((False,), "token strings are not returned (decode the ids with /detokenize)")
PROMPT_FIELDS = FieldRules(read=("model", "prompt", "add_special_tokens"),
                           no_op={"return_token_strs": _NO_STRS})
CHAT_FIELDS = FieldRules(read=("model", "messages", "add_special_tokens"), no_op={
    "add_generation_prompt": ((True,), "the service renders a chat with the assistant's turn opened after it, "
                                       "as it answers one"),
    "continue_final_message": ((False,), "the service does not continue a final assistant message"),
    "return_token_strs": _NO_STRS})
DETOKENIZE_FIELDS = FieldRules(read=("model", "tokens"))


@dataclass(frozen=True)
class Tokenizing:
    """What the routes read of the loaded LLM: its tokenizer and the longest sequence its model takes."""
    tokens: PromptTokenizer
    max_model_len: int | None

    def text_ids(self, text: str) -> list[int]:
        return self.tokens.text_ids(text)

    @property
    def vocab_size(self) -> int:
        return self.tokens.vocab_size


@dataclass(frozen=True)
class TokenizeRequest:
    prompt: str | None  # a completion's prompt, else
    messages: tuple[dict, ...]  # a chat's messages ({role, content}), as the template reads them


def _value(computed: Computed) -> dict:
    return computed.value


def register_tokenize_routes(app: Flask, front: Front, loaded: Callable[[], Tokenizing]) -> None:
    def tokenize(body: dict) -> Call:
        asked = parse_tokenize_request(body, front.bounds)

        def answer(deadline: Deadline):
            def computed():
                model = loaded()
                ids = model.text_ids(asked.prompt) if asked.prompt is not None else model.tokens.chat_ids(
                    asked.messages)
                yield Computed(tokenize_response(ids, model.max_model_len), served_by=None)  # node 0's tokenizer
            return front.gateway.require().admitted(computed)
        return Call(answer, reply=_value)

    def detokenize(body: dict) -> Call:
        ids = parse_detokenize_request(body, detokenize_limit(front.bounds))

        def answer(deadline: Deadline):
            def computed():
                model = loaded()
                bad = next((i for i, t in enumerate(ids) if t >= model.vocab_size), None)
                if bad is not None:
                    raise ApiError(400, f"'tokens[{bad}]' = {ids[bad]} is not a token id: the vocabulary has "
                                        f"{model.vocab_size}", field=f"tokens[{bad}]")
                yield Computed(DetokenizeResponse(prompt=model.tokens.decode(ids, skip_special_tokens=False)).model_dump(),
                               served_by=None)
            return front.gateway.require().admitted(computed)
        return Call(answer, reply=_value)

    front.edge.add(app, "/tokenize", tokenize)
    front.edge.add(app, "/detokenize", detokenize)


def _model(body: dict) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", field="model")
    if model is not None and model != MODEL_ID:
        raise ApiError(404, f"The model `{model}` does not exist; this service tokenizes for `{MODEL_ID}`",
                       field="model", code="model_not_found")


def _flag(body: dict, field: str) -> None:
    if body.get(field) is not None and type(body[field]) is not bool:
        raise ApiError(400, f"'{field}' must be true or false", field=field)


def parse_tokenize_request(body: dict, bounds: Bounds) -> TokenizeRequest:
    """A prompt or chat messages, checked; else the ApiError (400, 404) naming the field and the rule."""
    chat = body.get("messages") is not None
    (CHAT_FIELDS if chat else PROMPT_FIELDS).check(body)
    _model(body)
    _flag(body, "add_special_tokens")
    if not chat:
        if body.get("prompt") is None:
            raise ApiError(400, "'prompt' (a string) or 'messages' (a chat) is required", field="prompt")
        check_text(body["prompt"], "prompt", bounds)
        return TokenizeRequest(body["prompt"], ())
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of messages", field="messages")
    limits = bounds.limits
    rendered = []
    for i, message in enumerate(messages):
        roles = (*SYSTEM_ROLES, *TURN_ROLES)
        if not isinstance(message, dict) or message.get("role") not in roles:
            raise ApiError(400, f"'messages[{i}]' must be an object whose 'role' is one of {', '.join(roles)}",
                           field=f"messages[{i}].role")
        extra = [key for key, value in message.items() if key not in ("role", "content") and value is not None]
        if extra:
            raise ApiError(400, f"'messages[{i}].{extra[0]}' is not supported: /tokenize renders a message's role "
                                "and content", field=f"messages[{i}].{extra[0]}", code="unsupported_parameter")
        content = message_text(message.get("content"), f"messages[{i}].content")
        if len(content) > limits.max_query_chars:
            raise ApiError(400, f"'messages[{i}].content' is {len(content)} characters; the limit is "
                                f"{limits.max_query_chars} (MAX_QUERY_CHARS)", field=f"messages[{i}].content")
        # developer is OpenAI's newer name for system; the template knows system.
        rendered.append({"role": "system" if message["role"] in SYSTEM_ROLES else message["role"],
                         "content": content})
    tokens, limit = sum(bounds.count_tokens(m["content"]) for m in rendered), chat_limit(bounds)
    if tokens > limit:
        raise ApiError(400, f"'messages' hold {tokens} tokens of content; the limit is {limit} tokens "
                            "(MAX_QUERY_TOKENS + MAX_HISTORY_TOKENS, counted by the LLM's tokenizer)",
                       field="messages")
    return TokenizeRequest(None, tuple(rendered))


def chat_limit(bounds: Bounds) -> int:
    return bounds.limits.max_query_tokens + bounds.limits.max_history_tokens


def detokenize_limit(bounds: Bounds) -> int:
    return chat_limit(bounds) + bounds.max_new_tokens


def parse_detokenize_request(body: dict, max_tokens: int) -> list[int]:
    """The token ids (each a non-negative integer, at most `max_tokens`); else the ApiError naming the field."""
    DETOKENIZE_FIELDS.check(body)
    _model(body)
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise ApiError(400, "'tokens' must be an array of token ids", field="tokens")
    if len(ids) > max_tokens:
        raise ApiError(400, f"'tokens' holds {len(ids)} ids; the limit is {max_tokens} (MAX_QUERY_TOKENS + "
                            "MAX_HISTORY_TOKENS + OPENAI_MAX_TOKENS_CAP)", field="tokens")
    for i, t in enumerate(ids):
        if type(t) is not int or t < 0:
            raise ApiError(400, f"'tokens[{i}]' must be a non-negative integer token id", field=f"tokens[{i}]")
    return ids


def tokenize_response(ids: list[int], max_model_len: int | None) -> dict[str, Any]:
    return TokenizeResponse(count=len(ids), max_model_len=max_model_len, tokens=ids, token_strs=None).model_dump()
