"""services/server/answer_request.py: the one request object and the one parser of it."""
from __future__ import annotations

import pytest
from flask import Flask

from pipeline import spec
from pipeline.config import Settings
from services.server.answer_request import AnswerRequest, Bounds, read_request
from services.server.errors import ApiError

BOUNDS = Bounds(Settings.from_env({"MAX_QUERY_TOKENS": "16", "MAX_REQUEST_ID_CHARS": "8"}).limits, len)


def read(body: dict, *accepted: str) -> AnswerRequest:
    with Flask("t").test_request_context():
        return read_request(body, BOUNDS, accepted) if accepted else read_request(body, BOUNDS)


def test_a_body_is_one_request_and_a_field_the_route_does_not_offer_or_know_is_refused_by_name():
    body = {"request_id": "r1", "query": "Refund?", "max_new_tokens": 5, "stream": True}
    assert read(body) == AnswerRequest("r1", "Refund?", max_new_tokens=5, stream=True)
    for extra, *accepted in ((body, "request_id", "query", "stream"), ({**body, "other": 1},)):
        with pytest.raises(ApiError) as err:
            read(extra, *accepted)
        refused = "max_new_tokens" if accepted else "other"
        assert (err.value.status, err.value.field, err.value.code) == (400, refused, "unknown_parameter")
        assert f"'{refused}' is not a field of this request" in err.value.message
    with Flask("t").test_request_context():  # what the route reads itself is no stranger
        assert read_request({**body, "timeout_s": 3}, BOUNDS, also=("timeout_s",)).request_id == "r1"


@pytest.mark.parametrize("change,field,message", [
    ({"request_id": None}, "request_id", "'request_id' is required"),
    ({"request_id": "123456789"}, "request_id", "'request_id' is 9 characters; the limit is 8"),
    ({"query": 7}, "query", "'query' must be a string, got int"),
    ({"query": "x" * 17}, "query", "'query' is 17 tokens; the limit is 16 tokens (MAX_QUERY_TOKENS"),
    ({"max_new_tokens": 0}, "max_new_tokens", f"'max_new_tokens' must be an integer from 1 to {spec.MAX_NEW_TOKENS}"),
    ({"max_new_tokens": True}, "max_new_tokens", "'max_new_tokens' must be an integer"),
    ({"stream": "yes"}, "stream", "'stream' must be true or false"),
])
def test_each_refusal_names_the_field_and_the_rule(change, field, message):
    with pytest.raises(ApiError) as err:
        read({"request_id": "r1", "query": "Refund?", **change})
    assert (err.value.status, err.value.field) == (400, field) and message in err.value.message


def test_a_worker_is_sent_the_fields_not_at_their_default():
    assert AnswerRequest("r1", "q").wire() == {"request_id": "r1", "query": "q"}
    assert AnswerRequest("r1", "q", max_new_tokens=4).wire() == {"request_id": "r1", "query": "q", "max_new_tokens": 4}
    with Flask("t").test_request_context():  # what is sent reads back as the same request
        request = AnswerRequest("r1", "q", max_new_tokens=4, stream=True)
        assert read_request(request.wire(), BOUNDS) == request
