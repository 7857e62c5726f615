"""An answer stream as an HTTP response: Server-Sent Events, written as the events come.

An answer stream is an iterator of text pieces (str) closed by the reply (a dict). The first
event is taken before the response starts, so a request refused or failed before its first
token gets an ordinary HTTP error (a status the caller can act on: a gateway fails over on a
503); an error after that ends the stream with an `error` event carrying the status it would
have had. A reader that disconnects closes the stream (waitress closes the response's
iterator), which cancels what the stream was waiting on.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from flask import Response

from services.server import sse
from services.server.errors import http_answer

log = logging.getLogger(__name__)

AnswerStream = Iterator["str | dict"]
# What an error the errors table does not know is told as: a bug, logged with its traceback.
INTERNAL_ERROR = (500, "internal error")


def error_status(exc: BaseException) -> tuple[int, str]:
    """The status and message an error raised in a stream is answered with (the errors table's)."""
    answer = http_answer(exc)
    if answer is None:
        log.error("a stream failed", exc_info=exc)
        return INTERNAL_ERROR
    if answer.log_level is not None:
        log.log(answer.log_level, "a stream ended on %s: %s", type(exc).__name__, exc)
    return answer.status, answer.message


def started(events: AnswerStream) -> AnswerStream:
    """`events` with its first event already taken: errors before it are raised here."""
    try:
        first = next(events)
    except StopIteration:
        return iter(())
    except BaseException:
        events.close()  # type: ignore[attr-defined]  # a generator: release what it holds
        raise

    def rest() -> AnswerStream:
        try:
            yield first
            yield from events
        finally:
            events.close()  # type: ignore[attr-defined]

    return rest()


def sse_response(events: AnswerStream, encode: Callable[[AnswerStream], Iterator[bytes]] | None = None) -> Response:
    """The stream as SSE (the /query format: token events, then the reply, or an error event), or
    as `encode` writes it (the OpenAI chunks). Start it with `started` to raise early errors."""
    body = (encode or query_events)(events)
    return Response(body, headers=sse.HEADERS)


def query_events(events: AnswerStream) -> Iterator[bytes]:
    """The /query stream format (services/server/sse.py)."""
    try:
        for event in events:
            yield sse.token_event(event) if isinstance(event, str) else sse.reply_event(event)
    except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
        status, message = error_status(exc)
        yield sse.error_event(message, status)
    finally:
        events.close()  # type: ignore[attr-defined]
