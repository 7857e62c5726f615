"""The OpenAI-compatible API's response objects: the one answer type (services/server/answer.py) as
`chat.completion` and `text_completion` objects and as their streams' chunks; no HTTP.

Replies and stream chunks carry the sentiment and toxicity in an extra top-level `rag` field that
OpenAI clients ignore, and a sampled answer's seed in a `seed` field. Log probabilities and tool calls
take their shapes from openai_logprobs.py and openai_tools.py.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pipeline.continuous.output import FinishReason
from pipeline.tool_calls import ToolCallDelta
from services.roles.gateway import openai_schemas as schemas
from services.roles.gateway.openai_logprobs import chat_choice_logprobs, text_choice_logprobs
from services.roles.gateway.openai_tools import call_id, message_tool_calls
from services.server.answer import AnswerPiece, FinalAnswer, Usage

DONE = "[DONE]"  # the data of the last event of a stream
HISTORY_DROPPED = "history_turns_dropped"  # the answer's count of turns left out, in `usage`


def completion_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def reply_usage(answer: FinalAnswer) -> dict[str, int]:
    """The answer's usage; with a history, how many of its oldest turns the prompt left out
    (`history_turns_dropped`, an extension field)."""
    counted = answer.usage or Usage(0, 0)
    dropped = {HISTORY_DROPPED: answer.history_turns_dropped} if answer.history_turns_dropped is not None else {}
    return {**usage(counted.prompt_tokens, counted.completion_tokens), **dropped}


def rag_fields(answer: FinalAnswer) -> dict[str, Any]:
    """The extra `rag` field: sentiment, is_toxic, request_id and the data version that answered."""
    fields = {"sentiment": answer.sentiment, "is_toxic": answer.is_toxic, "request_id": answer.request_id}
    return {**fields, "data_version": answer.data_version} if answer.data_version is not None else fields


def seed_field(answer: FinalAnswer) -> dict[str, Any]:
    """The `seed` extension field of a sampled answer: the seed that gives it again."""
    return {"seed": answer.seed} if answer.seed is not None else {}


def _reason(answer: FinalAnswer) -> FinishReason:
    return answer.finish_reason or "stop"


def completion(id: str, created: int, model: str, answer: FinalAnswer) -> dict[str, Any]:
    """A `chat.completion` object of the answer (its usage, its tool calls, and its labels in `rag`),
    built by its schema (openai_schemas.py). With tool calls, a text of only whitespace is no content
    (null), as OpenAI's."""
    text = answer.generated_response
    calls = [schemas.ToolCall.model_validate(call) for call in message_tool_calls(answer.tool_calls)]
    message = schemas.AssistantMessage(role="assistant", content=text if not calls or text.strip() else None,
                                       refusal=None, **({"tool_calls": calls} if calls else {}))
    choice = schemas.ChatChoice(index=0, message=message, logprobs=chat_choice_logprobs(answer.logprobs),
                                finish_reason=_reason(answer))
    return schemas.ChatCompletion(id=id, object="chat.completion", created=created, model=model, choices=[choice],
                                  usage=schemas.Usage(**reply_usage(answer)), rag=rag_fields(answer),
                                  **seed_field(answer)).model_dump(exclude_unset=True)


def text_completion(id: str, created: int, model: str, answer: FinalAnswer) -> dict[str, Any]:
    """A `text_completion` object of the answer, built by its schema (openai_schemas.py)."""
    reason = _reason(answer)
    if reason == "tool_calls":  # the route offers no tools
        raise ValueError("a text completion makes no tool calls")
    choice = schemas.TextChoice(index=0, text=answer.generated_response,
                                logprobs=text_choice_logprobs(answer.logprobs), finish_reason=reason)
    return schemas.TextCompletion(id=id, object="text_completion", created=created, model=model, choices=[choice],
                                  usage=schemas.Usage(**reply_usage(answer)), rag=rag_fields(answer),
                                  **seed_field(answer)).model_dump(exclude_unset=True)


def chunk(id: str, created: int, model: str, delta: Mapping[str, Any], finish_reason: FinishReason | None = None,
          *, include_usage: bool = False, logprobs: Sequence[dict[str, Any]] | None = None,
          answer: FinalAnswer | None = None) -> dict[str, Any]:
    """A `chat.completion.chunk` with one choice; `usage: null` with include_usage (as OpenAI's); the
    log probabilities of the tokens its delta came from; with the `answer` (the last choice chunk) its
    `rag` and `seed` fields."""
    obj: dict[str, Any] = {
        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": chat_choice_logprobs(logprobs),
                     "finish_reason": finish_reason}],
    }
    if include_usage:
        obj["usage"] = None
    if answer is not None:
        obj = {**obj, "rag": rag_fields(answer), **seed_field(answer)}
    return obj


class ChatChunks:
    """One choice's answer stream as `chat.completion.chunk`s, as OpenAI streams them: the assistant's
    role and empty content; a chunk per text piece with the log probabilities of its tokens; a tool
    call as deltas (its index, id, type and name first, then its arguments in pieces); the last choice
    chunk (an empty delta, why the answer ended, the `rag` field and a sampled answer's `seed`).
    What the pieces did not bring (a replayed answer's calls, log probabilities a relay did not carry)
    comes with the last choice chunk's, so a client that accumulates the stream has the whole answer."""

    def __init__(self, id: str, created: int, model: str, *, include_usage: bool = False):
        self.id, self.created, self.model, self.include_usage = id, created, model, include_usage
        self._call_ids: dict[int, str] = {}  # each streamed call's id, by its index
        self._logprobs = 0  # log probabilities sent

    def _chunk(self, delta: Mapping[str, Any], finish_reason: FinishReason | None = None, **kw: Any) -> dict[str, Any]:
        return chunk(self.id, self.created, self.model, delta, finish_reason, include_usage=self.include_usage, **kw)

    def opening(self) -> list[dict[str, Any]]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def of(self, event: AnswerPiece | FinalAnswer) -> list[dict[str, Any]]:
        """The choice chunks of one event (the usage chunk is `usage`'s)."""
        if isinstance(event, AnswerPiece):
            self._logprobs += len(event.logprobs)
            logprobs = event.logprobs or None
            if event.tool_call is not None:
                return [self._chunk({"tool_calls": [self._call_delta(event.tool_call)]}, logprobs=logprobs)]
            # A piece with nothing in it (a relayed call's delta, which the relay did not carry) is no chunk.
            return [self._chunk({"content": event.text}, logprobs=logprobs)] if event.text or logprobs else []
        calls = [self._call_delta(ToolCallDelta(i, call.name, call.arguments))
                 for i, call in enumerate(event.tool_calls) if i not in self._call_ids]
        rest = (event.logprobs or ())[self._logprobs:]
        return [*(self._chunk({"tool_calls": [call]}) for call in calls),
                self._chunk({}, _reason(event), logprobs=rest or None, answer=event)]

    def usage(self, answer: FinalAnswer) -> dict[str, Any]:
        """The include_usage chunk: no choices, the usage."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": reply_usage(answer)}

    def _call_delta(self, delta: ToolCallDelta) -> dict[str, Any]:
        if delta.index in self._call_ids:
            return {"index": delta.index, "function": {"arguments": delta.arguments}}
        self._call_ids[delta.index] = call_id()
        return {"index": delta.index, "id": self._call_ids[delta.index], "type": "function",
                "function": {"name": delta.name or "", "arguments": delta.arguments}}


class TextChunks:
    """One choice's answer stream as `text_completion` chunks: one per text piece (with its tokens'
    legacy log probabilities, offsets counted from the answer's start), the last with why the answer
    ended (and the `rag` and `seed` fields, and any log probabilities the pieces did not bring)."""

    def __init__(self, id: str, created: int, model: str, *, include_usage: bool = False):
        self.id, self.created, self.model, self.include_usage = id, created, model, include_usage
        self._logprobs = 0  # log probabilities sent
        self._offset = 0  # characters of their tokens sent

    def _chunk(self, text: str, finish_reason: FinishReason | None, logprobs: Sequence[dict[str, Any]]
               ) -> dict[str, Any]:
        legacy = text_choice_logprobs(logprobs or None, self._offset)
        self._logprobs += len(logprobs)
        self._offset += sum(len(item["token"]) for item in logprobs)
        obj = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "text": text, "logprobs": legacy, "finish_reason": finish_reason}]}
        return {**obj, "usage": None} if self.include_usage else obj

    def opening(self) -> list[dict[str, Any]]:
        return []

    def of(self, event: AnswerPiece | FinalAnswer) -> list[dict[str, Any]]:
        if isinstance(event, AnswerPiece):
            return [self._chunk(event.text, None, event.logprobs)] if event.text or event.logprobs else []
        rest = (event.logprobs or ())[self._logprobs:]
        return [{**self._chunk("", _reason(event), rest), "rag": rag_fields(event), **seed_field(event)}]

    def usage(self, answer: FinalAnswer) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": reply_usage(answer)}


def stream_chunks(id: str, created: int, model: str, events: Iterable[AnswerPiece | FinalAnswer], *,
                  include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """An answer stream as `chat.completion.chunk`s (ChatChunks), then with include_usage one with no
    choices and the usage."""
    yield from write_chunks(ChatChunks(id, created, model, include_usage=include_usage), events)


def text_chunks(id: str, created: int, model: str, events: Iterable[AnswerPiece | FinalAnswer], *,
                include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """An answer stream as `text_completion` chunks (TextChunks), then with include_usage one with no
    choices and the usage."""
    yield from write_chunks(TextChunks(id, created, model, include_usage=include_usage), events)


def write_chunks(stream: ChatChunks | TextChunks, events: Iterable[AnswerPiece | FinalAnswer]
                 ) -> Iterator[dict[str, Any]]:
    """One choice's answer stream as `stream` writes it, then with include_usage its usage chunk."""
    yield from stream.opening()
    for event in events:
        yield from stream.of(event)
        if isinstance(event, FinalAnswer) and stream.include_usage:
            yield stream.usage(event)
