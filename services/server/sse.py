"""Server-Sent Events: writing events, the response headers, and a parser (`iter_events`, by the
HTML Living Standard's event-stream rules) for clients and tests.

The /query stream (`"stream": true`, or `Accept: text/event-stream`):

    event: token
    data: {"text": "<piece>"}           one per text piece as the answer is generated

    event: reply
    data: {"request_id": ..., "generated_response": ..., "sentiment": ..., "is_toxic": ...}
                                        the full reply, as /query without stream; the last event

    event: error
    data: {"error": "<message>", "status": <the HTTP status it would have had>}
                                        instead of the reply on a failure; the last event

The token events' pieces, joined, equal the reply's generated_response; comment lines
(keep-alives) may come between events. The OpenAI-compatible stream is unnamed events instead,
closed by `data: [DONE]` (services/roles/gateway/openai_responses.py).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

HEADERS: dict[str, str] = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx and its kin pass each event on instead of buffering
}
MEDIA_TYPE = "text/event-stream"

# The /query stream's event names.
TOKEN = "token"
REPLY = "reply"
ERROR = "error"

DEFAULT_NAME = "message"  # what a reader calls an event sent without an `event:` line
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its name ("message" unless named), its data, the last event id."""
    name: str
    data: str
    id: str | None = None

    def json(self) -> Any:
        """The data parsed as JSON (ValueError when it is not JSON)."""
        return json.loads(self.data)


def event(data: dict[str, Any] | str, name: str | None = None) -> bytes:
    """One event, UTF-8: `event: name` when named, a `data:` line per line of data, a blank line
    (a string's CR and CRLF breaks arrive as LF; a dict, as ASCII JSON, arrives exactly)."""
    # ASCII JSON: U+2028 and NEL stay escaped, for readers that split lines on them too.
    text = json.dumps(data, separators=(",", ":")) if isinstance(data, dict) else data
    lines = []
    if name is not None:
        if not name or _LINE_BREAK.search(name):
            raise ValueError(f"an event name is one non-empty line, got {name!r}")
        lines.append(f"event: {name}")
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(text))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def comment(text: str = "") -> bytes:
    """A comment line (readers ignore it), e.g. a keep-alive; text is kept to one line."""
    return f":{_LINE_BREAK.sub(' ', text)}\n\n".encode("utf-8")


def token_event(text: str) -> bytes:
    """A /query stream's text piece."""
    return event({"text": text}, TOKEN)


def reply_event(reply: dict[str, Any]) -> bytes:
    """A /query stream's last event on success: the full reply."""
    return event(reply, REPLY)


def error_event(message: str, status: int) -> bytes:
    """A /query stream's last event on failure: the message and the status it would have had."""
    return event({"error": message, "status": status}, ERROR)


def iter_events(lines: Iterable[bytes | str]) -> Iterator[SseEvent]:
    """The events of a stream given line by line (with or without breaks), as a spec-following
    reader dispatches them; an event the stream's end cuts off is discarded."""
    data: list[str] = []
    name = ""
    last_id: str | None = None
    first = True
    for raw in lines:
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        if first:
            line = line.removeprefix("\ufeff")
            first = False
        line = _strip_line_break(line)
        if not line:
            if data:
                yield SseEvent(name or DEFAULT_NAME, "\n".join(data), last_id)
            data, name = [], ""
            continue
        if line.startswith(":"):
            continue
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "id" and "\0" not in value:
            last_id = value
    # End of stream: an event without its closing blank line is discarded, as the spec says.


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines (without breaks) of a byte stream in chunks of any size: CR, LF and CRLF each end
    a line, a CRLF split across chunks included; what follows the last break is dropped."""
    rest = b""
    after_cr = False  # the previous chunk ended with CR: a LF opening this one belongs to it
    for chunk in chunks:
        if not chunk:
            continue
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        rest += chunk
        parts = rest.splitlines(keepends=True)
        rest = parts.pop() if parts and not parts[-1].endswith((b"\n", b"\r")) else b""
        after_cr = bool(parts) and not rest and parts[-1].endswith(b"\r")
        for part in parts:
            yield part[:-2] if part.endswith(b"\r\n") else part[:-1]


def _strip_line_break(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line
