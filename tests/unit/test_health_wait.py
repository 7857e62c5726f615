"""services.cluster.health_wait.wait_healthy against a real HTTP server on 127.0.0.1, every wait bounded."""
from __future__ import annotations

import threading
import time

import pytest

from services.cluster.health_wait import health, wait_healthy
from tests.fake_node import FakeNode
from tools.local import free_ports

pytestmark = pytest.mark.timeout(60)


def test_returns_the_health_body_at_once_when_healthy():
    with FakeNode() as node:
        started = time.monotonic()
        body = wait_healthy(node.url, timeout_s=5)
        assert body == {"status": "healthy", "node": 0, "total_nodes": 3}
        assert time.monotonic() - started < 1 and node.health_calls == 1


def test_waits_until_the_node_turns_healthy():
    with FakeNode(health_status=503) as node:
        threading.Timer(0.5, setattr, (node, "health_status", 200)).start()
        assert wait_healthy(node.url, timeout_s=10, poll_s=0.1)["status"] == "healthy"
        assert node.health_calls >= 2


def test_times_out_on_a_node_that_never_turns_healthy():
    with FakeNode(health_status=503) as node:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="/health did not answer 200"):
            wait_healthy(node.url, timeout_s=0.5, poll_s=0.1)
        assert 0.5 <= time.monotonic() - started < 3
        assert health(node.url) is None


def test_nothing_listening_is_a_bounded_timeout_and_asks_at_least_once():
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wait_healthy(url, timeout_s=0, request_timeout_s=1)
    assert time.monotonic() - started < 3


def test_check_gives_up_early():
    def exited():
        raise RuntimeError("node exited")

    with FakeNode(health_status=503) as node:
        with pytest.raises(RuntimeError, match="node exited"):
            wait_healthy(node.url, timeout_s=30, check=exited)
        assert node.health_calls == 0  # check runs before each poll
