"""The request bodies chat clients really send (tests/fixtures/client_requests/, recorded from the
pinned `openai`, `langchain-openai` and `litellm` by tests/support/client_requests.py, and Open
WebUI's derived from its source): the clients still send them, and the service reads each as the
conversation it is."""
from __future__ import annotations

import pytest

from services.roles.gateway.openai_api import parse_chat_request
from services.server.errors import ApiError
from tests.support.client_requests import CALLS, FIXTURES, MESSAGES, MODEL, OPEN_WEBUI, SYSTEM, fixture, record

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", CALLS)
def test_the_pinned_clients_send_the_recorded_bodies(name, monkeypatch):
    import platform
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list
    # The clients name the OS in a header; platform.platform() would find it by running `uname -p`.
    monkeypatch.setattr(platform, "platform", lambda *args, **kwargs: "Linux")
    assert record(name) == fixture(name)["body"]


def parse(body: dict):
    return parse_chat_request(body, max_tokens_limit=512, model_id=MODEL, default_max_tokens=128)


def test_every_fixture_is_a_recorded_call_or_an_open_webui_body():
    assert {path.stem for path in FIXTURES.glob("*.json")} == {*CALLS, *OPEN_WEBUI}


@pytest.mark.parametrize("name", [*CALLS, *(name for name, kind in OPEN_WEBUI.items() if kind == "chat")])
def test_each_recorded_body_is_accepted_as_its_conversation(name):
    request = parse(fixture(name)["body"])
    assert request.query == MESSAGES[-1]["content"] and request.instructions == SYSTEM
    assert request.history == tuple(MESSAGES[1:3])
    assert request.stream == bool(fixture(name)["body"].get("stream"))


def test_open_webuis_advanced_params_are_read_as_sent():
    request = parse(fixture("open_webui_chat_params")["body"])
    assert request.max_tokens == 256 and request.include_usage
    assert dict(request.sampling) == {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 42, "stop": ["Customer:"]}


@pytest.mark.parametrize(("field", "value"), [("frequency_penalty", 0.5), ("presence_penalty", 0.3), ("min_p", 0.05),
                                              ("logit_bias", {"1234": -100}), ("reasoning_effort", "low")])
def test_an_advanced_param_open_webui_sends_that_is_not_honoured_is_a_400_naming_it(field, value):
    # What its chat controls send when the user sets the parameter (logit_bias as token id -> bias).
    with pytest.raises(ApiError) as refused:
        parse({**fixture("open_webui_chat_params")["body"], field: value})
    assert refused.value.status == 400 and refused.value.field == field


@pytest.mark.parametrize("name", [name for name, kind in OPEN_WEBUI.items() if kind == "task"])
def test_open_webuis_background_tasks_are_one_question_over_the_chat(name):
    request = parse(fixture(name)["body"])
    assert not request.stream and request.history == () and request.instructions is None
    assert request.query.startswith("### Task:") and f"USER: {MESSAGES[1]['content']}" in request.query
