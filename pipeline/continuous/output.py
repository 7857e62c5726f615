"""The output side of generation, as vLLM v1's output processor: token ids in, the answer out.

The engine emits token ids and how each sequence ended (`Finish`); it never decodes. One
`OutputProcessor` per sequence turns its ids into text pieces as they come (never half a
character, nor any part of a stop string: pipeline/detokenize.py, pipeline/stop_strings.py),
aborts the sequence in the engine when a stop string lands, and gives the final text and finish
reason. Where the request offered tools, a Qwen2.5 tool call (its `<tool_call>` ... `</tool_call>`
token ids, pipeline/tool_calls.py) is held back from the text and becomes a `ToolCall`; one that does not
parse is given as text. While a call is generated its name and the arguments written so far are ready
as deltas (`take_call_deltas`), for a stream to send in pieces. A worker's streamed pieces and its reply's text both come from it, and the reference
runs its whole sequences through the same processor (`complete`), so they agree by construction.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pipeline.continuous.sampling import TokenLogprob
from pipeline.detokenize import Decoder, IncrementalDetokenizer
from pipeline.stop_strings import StopStringFilter
from pipeline.tool_calls import CallReader, ToolCall, ToolCallDelta, ToolCallTokens, parse_call

# OpenAI's: "stop" (an end-of-sequence token or a stop string), "length" (the cap, and neither of those),
# "tool_calls" (the model called a tool: at least one call, and the sequence ended by an end-of-sequence
# token or a stop string). The one definition: the OpenAI routes' replies say these.
FinishReason = Literal["stop", "length", "tool_calls"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)


class Finish(enum.Enum):
    """How the engine ended a sequence."""
    EOS = "eos"  # its last token is an end-of-sequence token
    LENGTH = "length"  # it reached its max_new_tokens without one
    ABORTED = "aborted"  # its output side ended it (a stop string) before either


def finish_of(token_ids: Sequence[int], eos_ids: frozenset[int]) -> Finish:
    """How a sequence the engine ran to its end (not aborted) ended: the engine's rule, for whole sequences."""
    return Finish.EOS if token_ids and token_ids[-1] in eos_ids else Finish.LENGTH


@dataclass(frozen=True)
class Completion:
    """One sequence's answer."""
    text: str
    finish_reason: FinishReason
    token_count: int  # the answer's tokens: those after the one that completed a stop string are not in it
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the model made, in order (only where tools were offered)


class OutputProcessor:
    """One sequence's output: push each token id as the engine emits it, then `finish` with how it ended.

    Not thread-safe: one thread feeds it (the decoder it reads may be shared if its decode only reads)."""

    def __init__(self, decoder: Decoder, stops: Sequence[str] = (), abort: Callable[[], None] | None = None,
                 tool_calls: ToolCallTokens | None = None, max_calls: int | None = None):
        """abort: ends the sequence in the engine; called once, when a stop string lands (or the last
        call allowed closes). tool_calls: the call tokens' ids, where the request offered tools (else a
        call is text). max_calls: the calls the answer may make (None: any; 1: OpenAI's
        parallel_tool_calls false): the answer ends where the last one closes."""
        self._decoder = decoder
        self._text = IncrementalDetokenizer(decoder)
        self._stops = StopStringFilter(stops)
        self._abort = abort
        self._pieces: list[str] = []
        self._call_tokens = tool_calls
        self._call: list[int] | None = None  # the ids of the call being generated, after its `<tool_call>`
        self._reader: CallReader | None = None  # that call's name and arguments as they come
        self._deltas: list[ToolCallDelta] = []  # the calls' progress not taken yet
        self.tool_calls: list[ToolCall] = []
        self._max_calls = max_calls
        self.token_count = 0
        self.finish_reason: FinishReason | None = None  # set by finish

    @property
    def stopped(self) -> bool:
        """A stop string landed (or the last call allowed closed): the answer is complete, whatever tokens
        still come."""
        return self._stops.stopped or self._calls_done

    @property
    def _calls_done(self) -> bool:
        return self._max_calls is not None and len(self.tool_calls) >= self._max_calls

    @property
    def text(self) -> str:
        """Every piece given out so far, joined: after finish, the answer."""
        return "".join(self._pieces)

    def push(self, token_id: int) -> str:
        """The text token_id adds to the answer ("" when none yet); nothing once a stop string landed."""
        if self.stopped or self.finish_reason is not None:
            return ""  # a token the engine made before it saw the abort, or after the end: not the answer's
        self.token_count += 1
        calls = self._call_tokens
        if calls is not None and self._call is None and token_id == calls.open_id:
            self._call, self._reader = [], CallReader()
            return ""
        if calls is not None and self._call is not None and self._reader is not None:
            index = len(self.tool_calls)
            if token_id != calls.close_id:
                self._call.append(token_id)
                name, arguments = self._reader.read(self._decoder.decode(self._call, skip_special_tokens=False))
                if name is not None or arguments:
                    self._deltas.append(ToolCallDelta(index, name, arguments))
                return ""
            (body, self._call), reader = (self._call, None), self._reader
            call = parse_call(self._decoder.decode(body, skip_special_tokens=False))
            if call is not None:
                self.tool_calls.append(call)
                # What the stream has not had of it yet: all of it, where it was not written in Qwen's order.
                named = reader.name == call.name and call.arguments.startswith(reader.arguments)
                rest = call.arguments[len(reader.arguments):] if named else call.arguments
                if not named or rest:
                    self._deltas.append(ToolCallDelta(index, None if named else call.name, rest))
                if self._calls_done and self._abort is not None:
                    self._abort()
                return ""
            return self._as_text([calls.open_id, *body, calls.close_id])
        return self._as_text([token_id])

    def take_call_deltas(self) -> list[ToolCallDelta]:
        """The calls' progress since the last take: each new name, each run of new argument characters."""
        deltas, self._deltas = self._deltas, []
        return deltas

    def _as_text(self, token_ids: Sequence[int]) -> str:
        """The text these ids add to the answer, through the detokenizer and the stop strings."""
        piece = ""
        for token_id in token_ids:
            if self._stops.stopped:
                break
            piece += self._stops.push(self._text.push(token_id))
        if self._stops.stopped and self._abort is not None:
            self._abort()
        return self._give(piece)

    def finish(self, finish: Finish) -> str:
        """The rest of the answer ("" when none), once the engine ended the sequence; sets finish_reason."""
        if self.finish_reason is not None:
            raise RuntimeError("finish was called twice")
        if finish is Finish.ABORTED and not self.stopped:
            raise ValueError("a sequence aborted before any stop string landed (or its last call) has no answer")
        unclosed = ""
        if self._call is not None and self._call_tokens is not None:  # a call the cap or eos cut: text
            body, self._call = self._call, None
            unclosed = self._as_text([self._call_tokens.open_id, *body])
        rest = "" if self._stops.stopped else self._stops.push(self._text.finish()) + self._stops.finish()
        if finish is Finish.LENGTH and not self._stops.stopped:
            self.finish_reason = "length"
        else:
            self.finish_reason = "tool_calls" if self.tool_calls else "stop"
        return unclosed + self._give(rest)

    def completion(self) -> Completion:
        """The answer, once finished."""
        if self.finish_reason is None:
            raise RuntimeError("the answer is not finished")
        return Completion(self.text, self.finish_reason, self.token_count, tuple(self.tool_calls))

    def _give(self, piece: str) -> str:
        if piece:
            self._pieces.append(piece)
        return piece


def logprob_content(decoder: Decoder, records: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Tokens' log probabilities as OpenAI's `logprobs.content`: each token's text, log probability,
    UTF-8 bytes and most likely alternatives. A token is decoded alone, so one holding part of a
    character reads as U+FFFD (and its bytes are that text's)."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = decoder.decode([token], skip_special_tokens=False)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
    return [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for t, lp in r.top]} for r in records]


def complete(decoder: Decoder, token_ids: Sequence[int], finish: Finish, stops: Sequence[str] = (),
             tool_calls: ToolCallTokens | None = None) -> Completion:
    """A whole sequence's answer, as its processor makes it token by token."""
    output = OutputProcessor(decoder, stops, tool_calls=tool_calls)
    for token_id in token_ids:
        output.push(token_id)
    output.finish(finish)
    return output.completion()
