"""`n` > 1 on /v1/chat/completions and /v1/completions: n answers to one request.

Each choice is an AnswerRequest of its own through the gateway (its own engine slot, request id
`<id>-<i>`), all run at once, each on a thread of its own, on one admission slot of the gateway's
(a full gateway refuses the request once, whole, as vLLM admits n; MAX_N bounds the work). A sampled
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
from services.server.answer import AnswerStream, Choice, Choices, FinalAnswer, Usage
from services.server.answer_request import AnswerRequest
from services.server.errors import ApiError
from services.server.stream_response import close

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


def merged(streams: Sequence[Callable[[], AnswerStream]]) -> Iterator[Choice]:
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
            yield Choice(i, event)
    finally:
        stop.set()


def collected(streams: Sequence[Callable[[], AnswerStream]]) -> AnswerStream:
    """The choices run at once, as one answer: each choice's final answer, in order."""
    replies: dict[int, FinalAnswer] = {}
    for choice in merged(streams):
        if isinstance(choice.event, FinalAnswer):
            replies[choice.index] = choice.event
    if len(replies) != len(streams):
        raise RuntimeError("a choice's answer stream ended without its final answer")
    yield Choices(tuple(replies[i] for i in range(len(streams))))


def summed_usage(answers: Sequence[FinalAnswer]) -> FinalAnswer:
    """The choices' answers as one answer's usage (choice 0's otherwise): the prompt's tokens once (one
    prompt), the choices' completion tokens summed, as OpenAI and vLLM count them."""
    counts = [answer.usage or Usage(0, 0) for answer in answers]
    return dataclasses.replace(answers[0], usage=Usage(counts[0].prompt_tokens,
                                                       sum(c.completion_tokens for c in counts)))


def choice_chunks(events: Iterator[Any], streams: Sequence[Any]) -> Iterator[dict]:
    """A merged stream (`Choice`s, where the edge passes an answer stream) as one stream's chunks, each
    choice's by its own chunk writer (`streams`, openai_responses' ChatChunks or TextChunks) with its index:
    each choice's opening chunks, then each event's, then with include_usage one chunk of the summed usage."""
    for i, stream in enumerate(streams):
        yield from (indexed(obj, i) for obj in stream.opening())
    replies: dict[int, FinalAnswer] = {}
    for choice in events:
        if isinstance(choice.event, FinalAnswer):
            replies[choice.index] = choice.event
        yield from (indexed(obj, choice.index) for obj in streams[choice.index].of(choice.event))
    if streams[0].include_usage and len(replies) == len(streams):
        yield streams[0].usage(summed_usage([replies[i] for i in range(len(streams))]))


def indexed(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """A one-choice object (a chunk or a completion) with that choice's index set."""
    return {**obj, "choices": [{**choice, "index": i} for choice in obj["choices"]]}
