"""services/server/sse.py: events written and read back, and the reader against the spec's edge cases."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.server import sse
from services.server.sse import SseEvent, iter_events, iter_lines


def read(body: bytes | str) -> list[SseEvent]:
    """A whole stream's events, split into lines as a client reading the socket would."""
    raw = body.encode() if isinstance(body, str) else body
    return list(iter_events(iter_lines([raw])))


def test_a_dict_is_one_compact_ascii_json_data_line():
    assert sse.event({"text": "héllo\u2028😀", "n": 1}, "token") == \
        b'event: token\ndata: {"text":"h\\u00e9llo\\u2028\\ud83d\\ude00","n":1}\n\n'
    assert read(sse.event({"text": "héllo\u2028😀"}))[0].json() == {"text": "héllo\u2028😀"}


def test_an_unnamed_string_event():
    assert sse.event("plain") == b"data: plain\n\n"
    assert read(sse.event("plain")) == [SseEvent("message", "plain")]


def test_multi_line_data_is_one_data_line_per_line():
    assert sse.event("a\nb\r\nc\rd") == b"data: a\ndata: b\ndata: c\ndata: d\n\n"
    assert read(sse.event("a\nb\n")) == [SseEvent("message", "a\nb\n")]


def test_an_event_name_must_be_one_line():
    with pytest.raises(ValueError):
        sse.event("x", "two\nlines")
    with pytest.raises(ValueError):
        sse.event("x", "")


def test_the_query_stream_events_round_trip():
    reply = {"request_id": "r1", "generated_response": "Answer: yes", "sentiment": "neutral", "is_toxic": "false"}
    body = sse.token_event("Answer") + sse.comment("keep-alive") + sse.token_event(": yes") + sse.reply_event(reply)
    events = read(body)
    assert [e.name for e in events] == [sse.TOKEN, sse.TOKEN, sse.REPLY]
    assert "".join(e.json()["text"] for e in events[:2]) == reply["generated_response"]
    assert events[2].json() == reply
    assert read(sse.error_event("Request timeout", 504)) == \
        [SseEvent("error", json.dumps({"error": "Request timeout", "status": 504}, separators=(",", ":")))]


def test_headers():
    assert sse.HEADERS == {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                           "X-Accel-Buffering": "no"}


@given(data=st.one_of(st.text(), st.dictionaries(st.text(), st.one_of(st.text(), st.integers(), st.none()))),
       name=st.one_of(st.none(), st.text(min_size=1).filter(lambda s: "\n" not in s and "\r" not in s)))
def test_round_trip(data, name):
    (got,) = read(sse.event(data, name))
    assert got.name == (name if name is not None else "message")
    if isinstance(data, dict):
        assert got.json() == data
    else:
        assert got.data == data.replace("\r\n", "\n").replace("\r", "\n")  # SSE lines end in any break; "\n" joins


# ---------------------------------------------------------------- the reader and the spec

def test_comments_and_keep_alives_are_ignored():
    assert read(": hello\n\n" + sse.comment("ping").decode() + "data: x\n\n") == [SseEvent("message", "x")]


def test_one_space_after_the_colon_is_dropped_and_no_more():
    assert read("data:x\n\ndata:  y\n\n") == [SseEvent("message", "x"), SseEvent("message", " y")]


def test_a_field_without_colon_has_an_empty_value():
    # "data" alone adds an empty line to the data: two data lines, "" and "x", join as "\nx".
    assert read("data\ndata: x\n\n") == [SseEvent("message", "\nx")]


def test_an_empty_data_line_dispatches_an_empty_event_but_no_data_dispatches_nothing():
    assert read("data:\n\n") == [SseEvent("message", "")]
    assert read("event: lonely\n\nid: 3\n\n") == []


def test_the_event_name_does_not_carry_over():
    assert read("event: a\ndata: 1\n\ndata: 2\n\n") == [SseEvent("a", "1"), SseEvent("message", "2")]


def test_the_last_event_id_carries_over_and_ignores_nul():
    assert read("id: 7\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\n") == \
        [SseEvent("message", "a", "7"), SseEvent("message", "b", "7"), SseEvent("message", "c", "7")]


def test_unknown_fields_and_retry_are_ignored():
    assert read("retry: 100\nfoo: bar\ndata: x\n\n") == [SseEvent("message", "x")]


def test_an_event_without_its_final_blank_line_is_discarded():
    assert read("data: done\n\ndata: cut") == [SseEvent("message", "done")]
    assert read("data: done\n\ndata: cut\n") == [SseEvent("message", "done")]


def test_a_leading_byte_order_mark_is_dropped():
    assert read("\ufeffdata: x\n\n") == [SseEvent("message", "x")]


@pytest.mark.parametrize("eol", ["\n", "\r", "\r\n"])
def test_every_line_break(eol):
    body = eol.join(["event: e", "data: 1", "data: 2", "", "data: 3", "", ""])
    assert read(body) == [SseEvent("e", "1\n2"), SseEvent("message", "3")]


def test_lines_may_arrive_as_str_with_or_without_breaks():
    assert list(iter_events(["data: a\n", "data: b", "\n", ""])) == [SseEvent("message", "a\nb")]


def test_invalid_utf8_is_replaced_not_raised():
    assert read(b"data: \xff\n\n") == [SseEvent("message", "\ufffd")]


@given(st.lists(st.integers(1, 7), min_size=1, max_size=40), st.sampled_from(["\n", "\r", "\r\n"]))
def test_lines_split_across_chunks_anywhere(cuts, eol):
    body = eol.join(["event: token", 'data: {"text":"日本 😀"}', "", ": c", "data: a", "data: b", "", ""]).encode()
    chunks, at = [], 0
    for cut in cuts * (len(body) // sum(cuts) + 1):
        chunks.append(body[at:at + cut])
        at += cut
    events = list(iter_events(iter_lines(chunks)))
    assert events == [SseEvent("token", '{"text":"日本 😀"}'), SseEvent("message", "a\nb")]
