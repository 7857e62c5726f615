"""One streamed generation's token ids, from the generate stage's thread to the request's thread.

The continuous engine calls `put` with each token id as it produces it (GenerationRequest.on_token);
the request's thread reads them with `read(deadline)` into the sequence's output processor
(pipeline/continuous/output.py), off the engine's thread. Reading ends once the generation's
future resolves (`end_with`): its last token is always put before its future resolves, so nothing
put is missed. A reader that stops early cancels the future; the stage then drops the sequence at
its next iteration. One whose output processor found a stop string asks the stage to `stop` it
instead, and reads on to the end (a few tokens the processor ignores).
"""
from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import Future

from services.server.errors import RequestTimeout

_END = object()


class TokenStream:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, token: int) -> None:
        self._queue.put(token)

    def end_with(self, future: Future) -> None:
        """The stream ends when `future` resolves (a result, an error or a cancel)."""
        future.add_done_callback(lambda _future: self._queue.put(_END))

    def read(self, deadline: float) -> Iterator[int]:
        """Each token id as it comes, until the generation ends; RequestTimeout at `deadline` (monotonic)."""
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RequestTimeout("request timed out") from None
            if item is _END:
                return
            yield item
