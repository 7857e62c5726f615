"""One answer's pieces as its output processor (pipeline/continuous/output.py) gives them, for the worker's
request path (services/roles/worker/request_path.py) to yield to the edge."""
from __future__ import annotations

from typing import Any, Iterator

from pipeline.continuous.output import logprob_content
from services.server.answer import AnswerPiece


class AnswerPieces:
    """One answer's pieces as its output processor gives them: each with the log probabilities (where
    asked) of the tokens pushed since the previous piece, and the tool-call deltas it has ready."""

    def __init__(self, decoder, logprobs: list | None):
        self._decoder = decoder
        self._logprobs = logprobs  # the engine's records, one per token; None: not asked
        self.given: tuple[dict[str, Any], ...] = ()  # the log probabilities given so far, in order

    def of(self, output, text: str, *, last: bool = False) -> Iterator[AnswerPiece]:
        """The pieces `text` and the calls' progress make; `last`: the answer's end, where the tokens
        that gave no text (a stop string's, an end-of-sequence token) give their log probabilities."""
        deltas = output.take_call_deltas()
        records = self._pending(output.token_count) if text or deltas or last else ()
        if text or (records and not deltas):
            yield AnswerPiece(text, logprobs=records)
            records = ()
        for i, delta in enumerate(deltas):
            yield AnswerPiece(tool_call=delta, logprobs=records if i == 0 else ())

    def _pending(self, token_count: int) -> tuple[dict[str, Any], ...]:
        if self._logprobs is None or len(self.given) >= token_count:
            return ()
        items = tuple(logprob_content(self._decoder, self._logprobs[len(self.given):token_count]))
        self.given += items
        return items
