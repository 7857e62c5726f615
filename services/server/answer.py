"""The one answer type, from the worker that computes it to the edge that shapes it for its route.

An answer stream is `AnswerPiece`s as the LLM produces them (text, the log probabilities of the tokens
that text came from, a tool call's name and the next characters of its arguments), closed by one
`FinalAnswer`: the reply, every field set once where it is known (the worker's request path: the text,
labels, usage, finish reason, calls, log probabilities, data version and sources; the worker's role:
which node computed it and its stage times; the reply cache: `cached`). No layer strips another's
fields; each route's edge picks what its clients see (`query_reply` for /query, the OpenAI spec in
services/roles/gateway/openai_responses.py for /v1).

The worker→gateway hop carries it as Server-Sent Events by one serializer/parser pair: `sse_event`
writes an event (a piece as a `token` event, the final answer as the `reply` event) and `from_sse` reads
it back. `from_relay` reads an event as a relay may give it, decoded: WorkerClient
(services/cluster/clients.py) gives a piece's text alone and the reply's JSON, so a remote worker's
log probabilities and tool calls reach the stream with its final answer (the OpenAI chunks send what
the pieces did not bring with the last choice chunk).
A gateway whose caller collects the reply asks the worker for no pieces but the first (`PIECES_HEADER`:
`none`): they would cross the hop, an event each, only to be dropped; the first starts the response
as the whole stream's does. A worker that does not know the header sends them all, which the gateway
reads as before.
`n` > 1 on /v1 answers with `Choice`s (one choice's event, with its index) or `Choices` (every choice's
final answer, collected); a route that gives no answer (embeddings, scores) with one `Computed`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Union

from pipeline.continuous.output import FINISH_REASONS, FinishReason
from pipeline.tool_calls import ToolCall, ToolCallDelta
from services.server import sse


@dataclass(frozen=True)
class AnswerPiece:
    """What the answer gained since the previous piece."""
    text: str = ""
    logprobs: tuple[dict[str, Any], ...] = ()  # OpenAI's content items of the tokens pushed since the last piece
    tool_call: ToolCallDelta | None = None

    def wire(self) -> dict[str, Any]:
        """As JSON: `text` always (a /query token event's data), the rest where set."""
        data: dict[str, Any] = {"text": self.text}
        if self.logprobs:
            data["logprobs"] = list(self.logprobs)
        if self.tool_call is not None:
            call = self.tool_call
            data["tool_call"] = {"index": call.index, "arguments": call.arguments,
                                 **({"name": call.name} if call.name is not None else {})}
        return data

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> AnswerPiece:
        call = data.get("tool_call")
        return cls(text=str(data.get("text", "")), logprobs=tuple(data.get("logprobs") or ()),
                   tool_call=None if call is None else ToolCallDelta(int(call["index"]), call.get("name"),
                                                                     str(call.get("arguments", ""))))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class FinalAnswer:
    """The reply: the contract's four fields, then what the service knows about the answer (None or
    empty: not known for this answer, and left out of its JSON)."""
    request_id: str
    generated_response: str
    sentiment: str
    is_toxic: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[dict[str, Any], ...] | None = None  # where asked: every answer token's
    data_version: str | None = None
    sources: tuple[Any, ...] | None = None  # each passage given, reranked (Document.as_source)
    history_turns_dropped: int | None = None  # with a history: how many of its oldest turns were left out
    seed: int | None = None  # a sampled answer's: the seed that gives it again
    served_by: int | str | None = None  # the worker that computed it
    stages_ms: Mapping[str, float] = field(default_factory=dict)  # its wait on each stage there
    cached: bool = False  # a reply-cache hit (re-addressed to this request_id)

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason is one of {', '.join(FINISH_REASONS)}, got {self.finish_reason!r}")

    def wire(self) -> dict[str, Any]:
        """As JSON, for the hop and the caches: every field known."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name in _EMPTY_UNKNOWN and not value):
                continue
            if f.name == "usage":
                value = {"prompt_tokens": value.prompt_tokens, "completion_tokens": value.completion_tokens}
            elif f.name == "tool_calls":
                value = [call.as_dict() for call in value]
            elif f.name in ("logprobs", "sources"):
                value = list(value)
            elif f.name == "stages_ms":
                value = dict(value)
            data[f.name] = value
        return data

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> FinalAnswer:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("usage"), Mapping):
            usage = values["usage"]
            values["usage"] = Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
        if "tool_calls" in values:
            values["tool_calls"] = tuple(ToolCall(c["name"], c["arguments"]) for c in values["tool_calls"] or ())
        for name in ("logprobs", "sources"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        values["stages_ms"] = dict(values.get("stages_ms") or {})
        return cls(**values)

    def query_reply(self, *, streamed: bool) -> dict[str, Any]:
        """/query's reply: the contract's fields and the service's extras; its stage times are the
        completion line's, and a plain reply leaves out the stream's usage and finish reason."""
        hidden = ("stages_ms",) if streamed else ("stages_ms", "usage", "finish_reason")
        return {k: v for k, v in self.wire().items() if k not in hidden}


# Fields whose empty value means "not known for this answer" (left out of the JSON).
_EMPTY_UNKNOWN = ("tool_calls", "stages_ms", "cached")


@dataclass(frozen=True)
class Choice:
    """One choice's event in a streamed `n` > 1 answer."""
    index: int
    event: AnswerEvent


@dataclass(frozen=True)
class Choices:
    """A collected `n` > 1 answer: each choice's final answer, in order."""
    answers: tuple[FinalAnswer, ...]


@dataclass(frozen=True)
class Computed:
    """What a route that gives no answer computed (embeddings, scores), and the worker that did."""
    value: Any
    served_by: int | str | None


# The worker→gateway hop's header: `none` when the gateway's caller reads the final answer only (the
# worker then sends the first piece and the final answer).
PIECES_HEADER = "X-Answer-Pieces"

AnswerEvent = Union[AnswerPiece, FinalAnswer]
AnswerStream = Iterator[Union[AnswerPiece, FinalAnswer, Choice, Choices, Computed]]


def final_of(event: object) -> FinalAnswer | None:
    """The final answer an event is or holds (a choice's; a collected answer's first), else None."""
    if isinstance(event, Choice):
        event = event.event
    if isinstance(event, Choices):
        return event.answers[0] if event.answers else None
    return event if isinstance(event, FinalAnswer) else None


def from_relay(event: object) -> AnswerPiece | FinalAnswer:
    """An event as a relay gives it: typed already, a piece's text (str), or a reply body (a JSON object)."""
    if isinstance(event, (AnswerPiece, FinalAnswer)):
        return event
    if isinstance(event, str):
        return AnswerPiece(event)
    if isinstance(event, Mapping):
        return FinalAnswer.from_wire(event)
    raise TypeError(f"an answer stream's event is a piece or a final answer, got {type(event).__name__}")


def sse_event(event: AnswerPiece | FinalAnswer) -> bytes:
    """The hop's serializer: a piece as a `token` event, the final answer as the `reply` event."""
    return sse.event(event.wire(), sse.TOKEN if isinstance(event, AnswerPiece) else sse.REPLY)


def from_sse(event: sse.SseEvent) -> AnswerPiece | FinalAnswer | None:
    """The hop's parser: a `token` or `reply` event read back (None for any other event)."""
    if event.name == sse.TOKEN:
        return AnswerPiece.from_wire(event.json())
    if event.name == sse.REPLY:
        return FinalAnswer.from_wire(event.json())
    return None
