"""The output side of generation, as vLLM v1's output processor: token ids in, the answer out.

The engine emits token ids and how each sequence ended (`Finish`); it never decodes. One
`OutputProcessor` per sequence turns its ids into text pieces as they come (never half a
character, nor any part of a stop string: pipeline/detokenize.py, pipeline/stop_strings.py),
aborts the sequence in the engine when a stop string lands, and gives the final text and finish
reason. A worker's streamed pieces and its reply's text both come from it, and the reference
runs its whole sequences through the same processor (`complete`), so they agree by construction.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pipeline.detokenize import Decoder, IncrementalDetokenizer
from pipeline.stop_strings import StopStringFilter

# OpenAI's: "stop" (an end-of-sequence token or a stop string), "length" (the cap, and neither of those).
# The one definition: the OpenAI routes' replies say these.
FinishReason = Literal["stop", "length"]
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


class OutputProcessor:
    """One sequence's output: push each token id as the engine emits it, then `finish` with how it ended.

    Not thread-safe: one thread feeds it (the decoder it reads may be shared if its decode only reads)."""

    def __init__(self, decoder: Decoder, stops: Sequence[str] = (), abort: Callable[[], None] | None = None):
        """abort: ends the sequence in the engine; called once, when a stop string lands."""
        self._text = IncrementalDetokenizer(decoder)
        self._stops = StopStringFilter(stops)
        self._abort = abort
        self._pieces: list[str] = []
        self.token_count = 0
        self.finish_reason: FinishReason | None = None  # set by finish

    @property
    def stopped(self) -> bool:
        """A stop string landed: the answer is complete, whatever tokens still come."""
        return self._stops.stopped

    @property
    def text(self) -> str:
        """Every piece given out so far, joined: after finish, the answer."""
        return "".join(self._pieces)

    def push(self, token_id: int) -> str:
        """The text token_id adds to the answer ("" when none yet); nothing once a stop string landed."""
        if self._stops.stopped or self.finish_reason is not None:
            return ""  # a token the engine made before it saw the abort, or after the end: not the answer's
        self.token_count += 1
        piece = self._stops.push(self._text.push(token_id))
        if self._stops.stopped and self._abort is not None:
            self._abort()
        return self._give(piece)

    def finish(self, finish: Finish) -> str:
        """The rest of the answer ("" when none), once the engine ended the sequence; sets finish_reason."""
        if self.finish_reason is not None:
            raise RuntimeError("finish was called twice")
        if finish is Finish.ABORTED and not self._stops.stopped:
            raise ValueError("a sequence aborted before any stop string landed has no answer")
        rest = "" if self._stops.stopped else self._stops.push(self._text.finish()) + self._stops.finish()
        self.finish_reason = "length" if finish is Finish.LENGTH and not self._stops.stopped else "stop"
        return self._give(rest)

    def completion(self) -> Completion:
        """The answer, once finished."""
        if self.finish_reason is None:
            raise RuntimeError("the answer is not finished")
        return Completion(self.text, self.finish_reason, self.token_count)

    def _give(self, piece: str) -> str:
        if piece:
            self._pieces.append(piece)
        return piece


def complete(decoder: Decoder, token_ids: Sequence[int], finish: Finish, stops: Sequence[str] = ()) -> Completion:
    """A whole sequence's answer, as its processor makes it token by token."""
    output = OutputProcessor(decoder, stops)
    for token_id in token_ids:
        output.push(token_id)
    output.finish(finish)
    return output.completion()
