"""The request bodies chat clients really send (tests/fixtures/client_requests/, recorded from the
pinned `openai`, `langchain-openai` and `litellm` by tests/support/client_requests.py): the clients
still send them, and the service reads each as the conversation it is."""
from __future__ import annotations

import pytest

from services.roles.gateway.openai_api import parse_chat_request
from tests.support.client_requests import CALLS, MESSAGES, MODEL, SYSTEM, fixture, record

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", CALLS)
def test_the_pinned_clients_send_the_recorded_bodies(name, monkeypatch):
    import platform
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list
    # The clients name the OS in a header; platform.platform() would find it by running `uname -p`.
    monkeypatch.setattr(platform, "platform", lambda *args, **kwargs: "Linux")
    assert record(name) == fixture(name)["body"]


@pytest.mark.parametrize("name", CALLS)
def test_each_recorded_body_is_accepted_as_its_conversation(name):
    request = parse_chat_request(fixture(name)["body"], max_tokens_limit=512, model_id=MODEL, default_max_tokens=128)
    assert request.query == MESSAGES[-1]["content"] and request.instructions == SYSTEM
    assert request.history == tuple(MESSAGES[1:3])
    assert request.stream == bool(fixture(name)["body"].get("stream"))
