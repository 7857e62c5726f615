"""`n` > 1 on /v1/chat/completions and /v1/completions: n answers to one request.

Each choice is an AnswerRequest of its own through the gateway (its own admission slot, its own
engine slot, request id `<id>-<i>`), all run at once, each on a thread of its own. A sampled
request's choice i decodes with seed + i (the request's `seed`, or one drawn here for them all, and
returned as the reply's `seed`), so choice 0 is the answer n = 1 gets and any choice is reproduced
alone by asking for its seed; a greedy request's choices are the one greedy answer n times. A choice
does not depend on the others, which share its batches. `usage` sums the choices'; streamed chunks
carry their choice's `index`. The first choice to fail fails the request, and the others are ended
at their next event.
"""
from __future__ import annotations

import contextvars
import dataclasses
import queue
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pipeline.sampling_params import MAX_SEED
from services.server.answer_request import AnswerRequest
from services.server.errors import ApiError
from services.server.stream_response import AnswerStream, close

MAX_N = 8  # choices a request may ask for: each is a whole answer's work
_END = object()


def read_n(fields: Mapping[str, Any]) -> int:
    value = fields.get("n", 1)
    if type(value) is not int or not 1 <= value <= MAX_N:
        raise ApiError(400, f"'n' must be an integer from 1 to {MAX_N} (each choice is a whole answer)", field="n")
    return value


def choice_requests(asked: AnswerRequest, n: int) -> list[AnswerRequest]:
    """The n choices' requests: ids `<id>-<i>`, a sampled one's seeds seed + i (wrapped to 64 bits)."""
    if n == 1:
        return [asked]
    base = asked.seed if asked.seed is not None or not asked.sampled else secrets.randbelow(MAX_SEED + 1)
    return [dataclasses.replace(asked, request_id=f"{asked.request_id}-{i}",
                                seed=None if base is None else _wrapped(base + i)) for i in range(n)]


def _wrapped(seed: int) -> int:
    return (seed + MAX_SEED + 1) % (2 * (MAX_SEED + 1)) - MAX_SEED - 1


def merged(streams: Sequence[Callable[[], AnswerStream]]) -> Iterator[tuple[int, str | dict]]:
    """Each choice's events as they come, with its index; a choice's error is raised here (the others
    then end at their next event). Closing it early ends them the same way."""
    events: queue.Queue = queue.Queue()
    stop = threading.Event()

    def run(i: int, open_stream: Callable[[], AnswerStream]) -> None:
        try:
            stream = open_stream()
            try:
                for event in stream:
                    if stop.is_set():
                        break
                    events.put((i, event, None))
            finally:
                close(stream)
            events.put((i, _END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            events.put((i, None, exc))

    for i, open_stream in enumerate(streams):
        # Each thread runs in a copy of this request's context: its id, its caller, its stage times.
        threading.Thread(target=contextvars.copy_context().run, args=(run, i, open_stream), daemon=True,
                         name=f"choice-{i}").start()
    ended = 0
    try:
        while ended < len(streams):
            i, event, error = events.get()
            if error is not None:
                raise error
            if event is _END:
                ended += 1
                continue
            yield i, event
    finally:
        stop.set()


def collected(streams: Sequence[Callable[[], AnswerStream]]) -> AnswerStream:
    """The choices run at once, as one reply: {"choices": [each choice's reply], "served_by"}."""
    replies: dict[int, dict] = {}
    for i, event in merged(streams):
        if isinstance(event, dict):
            replies[i] = event
    if len(replies) != len(streams):
        raise RuntimeError("a choice's answer stream ended without its reply")
    yield {"choices": [replies[i] for i in range(len(streams))], "served_by": replies[0].get("served_by")}


def summed_usage(replies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The choices' replies as one reply's usage: the prompt's tokens once (one prompt), the choices'
    completion tokens summed, as OpenAI and vLLM count them."""
    counts = [reply.get("usage") or {} for reply in replies]
    return {**replies[0], "usage": {"prompt_tokens": int(counts[0].get("prompt_tokens", 0)),
                                    "completion_tokens": sum(int(c.get("completion_tokens", 0)) for c in counts)}}


def choice_chunks(events: Iterator[Any], n: int, opening: Callable[[], list[dict]],
                  chunks_of: Callable[[str | dict], list[dict]], usage_chunk: Callable[[dict], dict] | None
                  ) -> Iterator[dict]:
    """A merged stream ((index, event) pairs, where the edge passes an answer stream) as one stream's chunks: each choice's opening chunks, then each event's chunks
    (`chunks_of`, one choice's) with its choice's index, then with include_usage (`usage_chunk`) one
    chunk of the summed usage."""
    for i in range(n):
        yield from (indexed(obj, i) for obj in opening())
    replies: dict[int, dict] = {}
    for i, event in events:
        if isinstance(event, dict):
            replies[i] = event
        yield from (indexed(obj, i) for obj in chunks_of(event))
    if usage_chunk is not None and len(replies) == n:
        yield usage_chunk(summed_usage([replies[i] for i in range(n)]))


def indexed(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """A one-choice object (a chunk or a completion) with that choice's index set."""
    return {**obj, "choices": [{**choice, "index": i} for choice in obj["choices"]]}
