"""The container tests' own helpers (tests/support/containers.py) where they hold logic of their own."""
from __future__ import annotations

from tests.support.containers import gateway_of


def test_the_bridge_gateway_is_the_one_named_else_the_subnets_first_address():
    assert gateway_of([{"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.254"}]) == "172.18.0.254"
    # Docker 20.10 (Debian's docker.io) names no gateway for its default bridge: the bridge holds the first address.
    assert gateway_of([{"Subnet": "172.17.0.0/16"}]) == "172.17.0.1"
    assert gateway_of([{"Subnet": "10.1.2.0/24", "Gateway": ""}]) == "10.1.2.1"
