"""Answer streams: what every layer of the request path returns, and the route's edge that sends one.

An answer stream is pieces closed by the final answer (services/server/answer.py), whose
`generated_response` is the pieces' text joined. A blocking reply is the stream collected (`collect`); a streamed one is
Server-Sent Events (`sse_response`), its first event taken first (`started`), so that an early
failure is an ordinary HTTP error and a later one an `error` event. A reader that disconnects
closes the stream, which cancels what it was waiting on.

A streamed response's status is known only at its end: `g.response_status` is then the status its
`error` event carried, `CLIENT_GONE` if the reader left first, or 200; the metrics and the completion
line are written after that (the request's teardown, when the server closes the response).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from flask import Response, g, has_request_context
from flask.globals import request_ctx

from services.server import sse
from services.server.answer import AnswerPiece, AnswerStream, FinalAnswer, sse_event
from services.server.errors import HttpAnswer, http_answer

log = logging.getLogger(__name__)

# What an error the errors table does not know is told as: a bug, logged with its traceback.
INTERNAL_ERROR = HttpAnswer(500, "internal error")
# A stream whose reader went away before its end is counted under nginx's "client closed request".
CLIENT_GONE = 499
# Set on `g` by `sse_response`: the request is measured when its stream ends, not when its view returns.
STREAMED = "response_streamed"


def close(events: AnswerStream) -> None:
    """End a stream read no further: a generator's `finally` runs now; a plain iterator holds nothing."""
    end = getattr(events, "close", None)
    if end is not None:
        end()


def collect(events: AnswerStream) -> Any:
    """The blocking reply: the stream read to its end, and its last event that is no piece (a final
    answer, which holds the text, or n choices' answers)."""
    reply: Any = None
    try:
        for event in events:
            if not isinstance(event, AnswerPiece):
                reply = event
    finally:
        close(events)
    if reply is None:
        raise RuntimeError("the answer stream ended without its reply")
    return reply


def replay(known: FinalAnswer) -> Iterator[AnswerPiece | FinalAnswer]:
    """A final answer already known as a stream: its whole text as one piece, then the answer."""
    if known.generated_response:
        yield AnswerPiece(known.generated_response, logprobs=known.logprobs or ())
    yield known


def relay(open_stream: Callable[[], AnswerStream], *, landed: Callable[[Any], None],
          failed: Callable[[BaseException], None]) -> AnswerStream:
    """The events of `open_stream()` passed on, then `landed(reply)` (its last event that is no piece);
    any failure on the way (a reader gone included) goes to `failed` before it goes up."""
    reply: Any = None
    events: AnswerStream | None = None
    try:
        events = open_stream()
        for event in events:
            if not isinstance(event, AnswerPiece):
                reply = event
            yield event
        if reply is None:
            raise RuntimeError("the answer stream ended without its reply")
    except BaseException as exc:
        failed(exc)
        raise
    finally:
        if events is not None:
            close(events)
    if reply is not None:
        landed(reply)


def error_answer(exc: BaseException) -> HttpAnswer:
    """What an error raised in a stream is answered with (the errors table's row)."""
    answer = http_answer(exc)
    if answer is None:
        log.error("a stream failed", exc_info=exc)
        _note_status(INTERNAL_ERROR.status)
        return INTERNAL_ERROR
    if answer.log_level is not None:
        log.log(answer.log_level, "a stream ended on %s: %s", type(exc).__name__, exc)
    _note_status(answer.status)
    return answer


def started(events: AnswerStream) -> AnswerStream:
    """`events` with its first event already taken: errors before it are raised here."""
    try:
        first = next(events)
    except StopIteration:
        return iter(())
    except BaseException:
        close(events)  # release what it holds
        raise

    def rest() -> AnswerStream:
        try:
            yield first
            yield from events
        finally:
            close(events)

    return rest()


def sse_response(events: AnswerStream, encode: Callable[[AnswerStream], Iterator[bytes]] | None = None) -> Response:
    """The stream as SSE (the /query format), or as `encode` writes it (the OpenAI chunks). The
    request context stays open until the response closes: the stream reads `g`, and the teardown
    (completion line, tracing span) must come after its last event."""
    g.setdefault(STREAMED, True)
    response = Response(_noting_end((encode or query_events)(events)), headers=sse.HEADERS)
    context = request_ctx._get_current_object()  # type: ignore[attr-defined]
    context.push()  # a second push: the view's own pop leaves it open, this one's pop tears it down
    response.call_on_close(context.pop)
    return response


def _note_status(status: int) -> None:
    """The status a stream ends with, for its metrics and completion line (read at its teardown)."""
    if has_request_context():
        g.response_status = status


def _noting_end(body: Iterator[bytes]) -> Iterator[bytes]:
    """The body as it is; a reader gone before its end noted as CLIENT_GONE, a body that breaks
    (no error event could be sent) as 500; an error event has noted its own status."""
    try:
        yield from body  # closing this closes body too
    except Exception:
        _note_status(INTERNAL_ERROR.status)
        raise
    except GeneratorExit:  # the server closed the response before its last byte: the reader left
        _note_status(CLIENT_GONE)
        raise


def query_events(events: AnswerStream) -> Iterator[bytes]:
    """The /query stream format (services/server/sse.py)."""
    return _sse_answer(events, lambda event: sse.token_event(event.text) if isinstance(event, AnswerPiece)
                       else sse.reply_event(event.query_reply(streamed=True)))


def internal_events(events: AnswerStream) -> Iterator[bytes]:
    """The worker→gateway hop's stream: every field of each piece and of the final answer (the hop's
    serializer, services/server/answer.py), in /query's event names."""
    return _sse_answer(events, sse_event)


def internal_reply_events(events: AnswerStream) -> Iterator[bytes]:
    """The hop's stream for a gateway whose caller collects the reply (PIECES_HEADER): the first piece, then
    the final answer. The first piece still goes so that the response starts when the answer does, as the
    whole stream's: an error before it is an ordinary HTTP error, and the gateway's wait for the
    response to start overlaps the generation instead of following it."""
    return _sse_answer(_first_piece_only(events), sse_event)


def _first_piece_only(events: AnswerStream) -> AnswerStream:
    first = True
    try:
        for event in events:
            if not isinstance(event, AnswerPiece) or first:
                first = False
                yield event
    finally:
        close(events)  # a reader gone early cancels what the stream waits on, as with its pieces


def _sse_answer(events: AnswerStream, encode: Callable[[Any], bytes]) -> Iterator[bytes]:
    try:
        for event in events:
            yield encode(event)
    except Exception as exc:  # noqa: BLE001 - told to the reader; a disconnect (GeneratorExit) is not
        answer = error_answer(exc)
        yield sse.error_event(answer.message, answer.status)
    finally:
        close(events)
