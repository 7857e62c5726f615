"""The one request object every route makes and every layer passes down, and the one parser of it.

/query, /v1/chat/completions and /v1/completions (translated first by
services/roles/gateway/openai_api.py) and a worker's /internal/answer each read their body with
`read_request`, by the same rules; a field refused is an ApiError 400 naming the field and the rule it
broke, and a field no rule reads is refused too. /v1/embeddings' inputs take `check_text`, the same
checks as a query. To add a field: give
AnswerRequest the field with its default and RULES its rule; `wire` sends it on to the worker.
The decoding fields are /v1's only: /query's answer is the contract's greedy one. The caller is no
body field: it is the API key the request was let in with (services/server/auth.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import spec
from pipeline.config.sections import LimitsSettings
from pipeline.conversation import Conversation, Turn
from pipeline.sampling_params import MAX_SEED, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, Sampling
from services.server.auth import authenticated_caller
from services.server.body import require_string
from services.server.errors import ApiError
from services.server.fields import FieldRules
from services.server.request_ids import bind_request_id
from services.server.turn_fields import check_unicode, function_tools, turns


@dataclass(frozen=True)
class AnswerRequest:
    """One request for an answer, whichever route it came by."""
    request_id: str  # the idempotency key: an id is answered once, with one answer
    query: str
    max_new_tokens: int | None = None  # a cap on new tokens (at most Bounds.max_new_tokens); None: the contract's 128
    stream: bool = False  # the caller reads the text pieces as they come (else the reply is collected)
    temperature: float = 0.0  # 0: greedy (top_p, top_k and seed then change nothing)
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    seed: int | None = None  # a sampled request's random stream; None: drawn by the worker
    stop: tuple[str, ...] = ()  # the answer ends before the first of these, which is not returned
    logprobs: int | None = None  # each answer token's log probability with this many alternatives; None: none
    # The conversation before `query` (pipeline/conversation.py): earlier turns as sent, oldest first
    # (the worker fits them to MAX_HISTORY_TOKENS), and the client's instructions.
    history: tuple[Turn, ...] = ()
    instructions: str | None = None
    # The function tools offered (OpenAI's shape, as the template renders them: those tool_choice lets the
    # model see), and the tool round after the question (assistant calls, then tool results).
    tools: tuple[dict, ...] = ()
    tool_round: tuple[Turn, ...] = ()
    parallel_tool_calls: bool = True  # false: the answer ends where its first tool call closes (at most one)
    # Whose request: its API key's identity (None without keys). The gateway scopes request ids and
    # replies to it; never read from a body nor sent on (not in `wire`, so not in the id's digest).
    caller: str | None = None

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def conversation(self) -> Conversation:
        return Conversation(self.history, self.instructions, self.tools, self.tool_round)

    @property
    def is_the_questions_answer(self) -> bool:
        """Greedy, uncapped, without stop strings: /query's answer to its query in its conversation,
        which the reply cache holds (by `conversation_key`)."""
        return self.max_new_tokens is None and not self.sampled and not self.stop and self.logprobs is None \
            and self.parallel_tool_calls

    @property
    def conversation_key(self) -> str:
        """The conversation before the query, hashed ("" with none): replies are cached by it, so two
        conversations that end in the same question never share one."""
        if not self.conversation:
            return ""
        sent = {"history": [turn.wire() for turn in self.history], "instructions": self.instructions}
        if self.tools or self.tool_round:
            sent = {**sent, "tools": list(self.tools), "tool_round": [turn.wire() for turn in self.tool_round]}
        return hashlib.sha256(json.dumps(sent, sort_keys=True).encode("utf-8")).hexdigest()

    def sampling(self, drawn_seed: int) -> Sampling | None:
        """How the LLM decodes it (None: greedy, no stop strings); `drawn_seed` serves a sampled request
        that names no seed."""
        if not self.sampled and not self.stop and self.logprobs is None:
            return None
        seed = self.seed if self.seed is not None or not self.sampled else drawn_seed
        return Sampling(self.temperature, self.top_p, self.top_k, seed, self.stop, self.logprobs)

    def wire(self) -> dict[str, Any]:
        """The body fields a worker is sent: those not at their default (the caller is never sent)."""
        fields = {f.name: value for f in dataclasses.fields(self)
                  if f.name != "caller" and (value := getattr(self, f.name)) != f.default}
        for name in ("history", "tool_round"):
            if name in fields:
                fields[name] = [turn.wire() for turn in fields[name]]
        if self.tools:
            fields["tools"] = list(self.tools)
        return fields


@dataclass(frozen=True)
class Bounds:
    """What the rules check against: the LIMITS settings, the LLM tokenizer's count of a text and the
    most new tokens an answer may have (OPENAI_MAX_TOKENS_CAP)."""
    limits: LimitsSettings
    count_tokens: Callable[[str], int]
    max_new_tokens: int = spec.MAX_NEW_TOKENS


def _request_id(body: Mapping[str, Any], bounds: Bounds) -> str:
    """Bound to the request at once (the X-Request-ID default), so a refusal of a later field names it."""
    request_id = require_string(body, "request_id", bounds.limits.max_request_id_chars)
    bind_request_id(request_id)
    return request_id


def _query(body: Mapping[str, Any], bounds: Bounds) -> str:
    query = body.get("query")
    check_text(query, "query", bounds)
    return str(query)


def check_text(value: Any, field: str, bounds: Bounds) -> int:
    """The one set of checks on a text to answer or embed: a non-empty string, bounded in characters
    (MAX_QUERY_CHARS: cheap, first), then in the LLM tokenizer's tokens (MAX_QUERY_TOKENS: the tokens
    bound the prompt, its KV reservation and its prefill, which characters do not: an emoji is four
    tokens). Its token count, or an ApiError 400 naming `field`."""
    text = require_string({field: value}, field, bounds.limits.max_query_chars)
    return check_query_tokens(text, bounds, field)


def check_query_tokens(text: str, bounds: Bounds, field: str = "query") -> int:
    """The text's tokens, or an ApiError 400 where they are over MAX_QUERY_TOKENS."""
    tokens, limit = bounds.count_tokens(text), bounds.limits.max_query_tokens
    if tokens > limit:
        raise ApiError(400, f"'{field}' is {tokens} tokens; the limit is {limit} tokens "
                            "(MAX_QUERY_TOKENS, counted by the LLM's tokenizer)", field=field)
    return tokens


def _max_new_tokens(body: Mapping[str, Any], bounds: Bounds) -> int | None:
    value, limit = body.get("max_new_tokens"), bounds.max_new_tokens
    if value is not None and (type(value) is not int or not 1 <= value <= limit):
        raise ApiError(400, f"'max_new_tokens' must be an integer from 1 to {limit}", field="max_new_tokens")
    return value


def _stream(body: Mapping[str, Any], bounds: Bounds) -> bool:
    value = body.get("stream", False)
    if type(value) is not bool:
        raise ApiError(400, "'stream' must be true or false", field="stream")
    return value


def _number(body: Mapping[str, Any], field: str, default: float, low: float, high: float, rule: str) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"'{field}' must be a number {rule}", field=field)
    return float(value)


def _temperature(body: Mapping[str, Any], bounds: Bounds) -> float:
    return _number(body, "temperature", 0.0, 0.0, 2.0, "from 0 to 2")


def _top_p(body: Mapping[str, Any], bounds: Bounds) -> float:
    value = _number(body, "top_p", 1.0, 0.0, 1.0, "over 0 and at most 1")
    if value == 0:
        raise ApiError(400, "'top_p' must be a number over 0 and at most 1", field="top_p")
    return value


def _top_k(body: Mapping[str, Any], bounds: Bounds) -> int:
    value = body.get("top_k")
    if value is not None and (type(value) is not int or value < -1):
        raise ApiError(400, "'top_k' must be an integer: -1 or 0 (all tokens), or at least 1", field="top_k")
    return value or 0


def _seed(body: Mapping[str, Any], bounds: Bounds) -> int | None:
    value = body.get("seed")
    if value is not None and (type(value) is not int or not -MAX_SEED - 1 <= value <= MAX_SEED):
        raise ApiError(400, "'seed' must be an integer that fits in 64 bits (signed)", field="seed")
    return value


def _stop(body: Mapping[str, Any], bounds: Bounds) -> tuple[str, ...]:
    """OpenAI's `stop`: null, one string or a list of up to MAX_STOP_STRINGS non-empty strings."""
    value = body.get("stop")
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items) \
            or len(items) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings, each of "
                            f"1 to {MAX_STOP_CHARS} characters", field="stop")
    return tuple(items)


def _logprobs(body: Mapping[str, Any], bounds: Bounds) -> int | None:
    """How many alternatives to give with each answer token's log probability (0 to MAX_TOP_LOGPROBS);
    null: no log probabilities."""
    value = body.get("logprobs")
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} (the alternatives given with "
                            "each token's log probability)", field="logprobs")
    return value


def _history(body: Mapping[str, Any], bounds: Bounds) -> tuple[Turn, ...]:
    """Earlier turns, oldest first: an array of {"role": "user" | "assistant" | "tool", "content": string},
    an assistant turn with its `tool_calls` ([{"name": string, "arguments": JSON text of an object}]). Its
    cost is bounded in tokens where it is used (the worker keeps the newest turns within
    MAX_HISTORY_TOKENS) and in bytes here (MAX_BODY_BYTES)."""
    return turns(body, "history")


def _tool_round(body: Mapping[str, Any], bounds: Bounds) -> tuple[Turn, ...]:
    """The tool round after the question, in order: turns as `history`'s, assistant or tool ones."""
    read = turns(body, "tool_round")
    for i, turn in enumerate(read):
        if turn.role == "user":
            raise ApiError(400, f"'tool_round[{i}].role' must be assistant or tool (a user turn ends a tool round)",
                           field=f"tool_round[{i}].role")
    return read


def _tools(body: Mapping[str, Any], bounds: Bounds) -> tuple[dict, ...]:
    return function_tools(body.get("tools"))


def _parallel_tool_calls(body: Mapping[str, Any], bounds: Bounds) -> bool:
    """OpenAI's `parallel_tool_calls`: false allows the answer one tool call (it ends where that closes)."""
    value = body.get("parallel_tool_calls")
    if value is None:
        return True
    if type(value) is not bool:
        raise ApiError(400, "'parallel_tool_calls' must be true or false", field="parallel_tool_calls")
    return value


def _instructions(body: Mapping[str, Any], bounds: Bounds) -> str | None:
    """The client's instructions, added after the service's system prompt: a string within
    MAX_HISTORY_TOKENS (the conversation's share of the prompt)."""
    value = body.get("instructions")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, "'instructions' must be a string", field="instructions")
    check_unicode(value, "instructions")
    tokens, limit = bounds.count_tokens(value), bounds.limits.max_history_tokens
    if tokens > limit:
        raise ApiError(400, f"'instructions' is {tokens} tokens; the limit is {limit} tokens (MAX_HISTORY_TOKENS, "
                            "the conversation's share of the prompt)", field="instructions")
    return value


# Each field's rule, in the order they are checked (request_id first: it names the request).
RULES: dict[str, Callable[[Mapping[str, Any], Bounds], Any]] = {
    "request_id": _request_id, "query": _query, "max_new_tokens": _max_new_tokens, "stream": _stream,
    "temperature": _temperature, "top_p": _top_p, "top_k": _top_k, "seed": _seed, "stop": _stop,
    "logprobs": _logprobs,
    "history": _history, "instructions": _instructions, "tools": _tools, "tool_round": _tool_round,
    "parallel_tool_calls": _parallel_tool_calls}
ALL_FIELDS: tuple[str, ...] = tuple(RULES)


def read_request(body: Mapping[str, Any], bounds: Bounds, accepted: Collection[str] = ALL_FIELDS, *,
                 also: Collection[str] = ()) -> AnswerRequest:
    """The request a body asks for, from the caller the HTTP request was authenticated as. A field outside `accepted` (and `also`, the fields the route reads
    itself) is refused, naming it: a field the service would not act on is never ignored in silence."""
    refuse_unknown(body, (*accepted, *also))
    request = AnswerRequest(**{name: rule(body, bounds) for name, rule in RULES.items() if name in accepted},
                            caller=authenticated_caller())
    fixed, limit = request.conversation.fixed_tokens(bounds.count_tokens), bounds.limits.max_history_tokens
    if fixed > limit:  # no dropped turn could make room for them
        field = "tool_round" if request.tool_round else "tools" if request.tools else "instructions"
        raise ApiError(400, f"the instructions, tools and tool round are {fixed} tokens; the limit is {limit} tokens "
                            "(MAX_HISTORY_TOKENS, the conversation's share of the prompt)", field=field)
    return request


def refuse_unknown(body: Mapping[str, Any], known: Collection[str]) -> None:
    """An ApiError 400 naming the first field of `body` outside `known` (services/server/fields.py)."""
    FieldRules(tuple(known)).check(body)
