"""services/server/answer.py: the one answer type, and the worker→gateway hop's serializer and parser
(an answer written as /internal/answer writes it and read back is the same answer, every field)."""
from __future__ import annotations

import pytest

from pipeline.tool_calls import ToolCall, ToolCallDelta
from services.server import sse
from services.server.answer import (
    AnswerPiece,
    Choice,
    Choices,
    Computed,
    FinalAnswer,
    Usage,
    final_of,
    from_relay,
    from_sse,
)
from services.server.stream_response import internal_events, internal_reply_events, query_events

ITEM = {"token": "Re", "logprob": -0.5, "bytes": [82, 101], "top_logprobs": []}
FINAL = FinalAnswer("r-1", "Refunds", "neutral", "false", finish_reason="tool_calls", usage=Usage(40, 3),
                    tool_calls=(ToolCall("refund", '{"id": 1}'),), logprobs=(ITEM,), data_version="v2",
                    sources=(4, {"document": "a.md"}), history_turns_dropped=1, seed=7, served_by=1,
                    stages_ms={"embed": 1.5})
EVENTS = [AnswerPiece("Re", (ITEM,)), AnswerPiece(tool_call=ToolCallDelta(0, "refund", '{"id"')),
          AnswerPiece(tool_call=ToolCallDelta(0, None, ": 1}")), FINAL]


def read_back(body: bytes) -> list:
    return [from_sse(event) for event in sse.iter_events(body.splitlines(keepends=True))]


def test_the_hops_serializer_and_parser_give_back_every_field():
    assert read_back(b"".join(internal_events(iter(EVENTS)))) == EVENTS


def test_query_streams_the_contracts_events_without_the_stage_times():
    events = list(sse.iter_events(b"".join(query_events(iter(EVENTS))).splitlines(keepends=True)))
    assert [e.name for e in events] == ["token"] * 3 + ["reply"]
    reply = events[-1].json()
    assert "stages_ms" not in reply and reply["served_by"] == 1 and reply["usage"] == {"prompt_tokens": 40,
                                                                                     "completion_tokens": 3}
    assert FINAL.query_reply(streamed=False).keys() == reply.keys() - {"usage", "finish_reason"}


def test_json_leaves_out_what_is_not_known_and_a_finish_reason_is_openais():
    plain = FinalAnswer("r", "a", "neutral", "false")
    assert plain.wire() == {"request_id": "r", "generated_response": "a", "sentiment": "neutral", "is_toxic": "false"}
    assert FinalAnswer.from_wire(FINAL.wire()) == FINAL
    with pytest.raises(ValueError):
        FinalAnswer("r", "a", "neutral", "false", finish_reason="content_filter")  # type: ignore[arg-type]


def test_a_relays_text_and_reply_json_read_as_the_answer_type():
    assert from_relay("Re") == AnswerPiece("Re") and from_relay(FINAL.wire()) == FINAL and from_relay(FINAL) is FINAL
    with pytest.raises(TypeError):
        from_relay(3)


def test_the_final_answer_an_event_holds():
    other = FinalAnswer("r-2", "b", "neutral", "false")
    assert final_of(FINAL) is FINAL and final_of(Choice(1, other)) is other and final_of(Choices((other, FINAL))) is other
    assert final_of(AnswerPiece("x")) is None and final_of(Choice(0, AnswerPiece("x"))) is None
    assert final_of(Computed([1.0], 0)) is None


def test_the_hops_reply_stream_sends_the_first_piece_and_the_final_answer_and_closing_it_closes_the_answer():
    closed = []

    def answer():
        try:
            yield AnswerPiece("Hel")
            yield AnswerPiece("lo")
            yield FinalAnswer("r1", "Hello", "neutral", "false")
        finally:
            closed.append(True)

    events = list(sse.iter_events(b"".join(internal_reply_events(answer())).splitlines(keepends=True)))
    assert [from_sse(e) for e in events] == [AnswerPiece("Hel"), FinalAnswer("r1", "Hello", "neutral", "false")]
    assert closed == [True]
    reader = internal_reply_events(answer())
    next(reader)
    reader.close()  # a reader gone after the first piece: the answer is closed at once, not left suspended
    assert closed == [True, True]
