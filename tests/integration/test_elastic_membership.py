"""Membership that changes at run time, as real processes: the gateway discovers its workers and the
workers their index replicas by name (WORKER_DISCOVERY, INDEX_DISCOVERY), resolved through a
hosts-style file (DISCOVERY_HOSTS_FILE; production resolves DNS) that lists workers on loopback
addresses of their own (127.0.0.2, 127.0.0.3: one port, as pods behind one headless Service). Under
a steady load a second worker joins and serves once ready, then the first drains (SIGTERM) and
leaves: every request is answered."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from tests.helpers import cluster_env, wait_until
from tests.support import forked_nodes
from tests.support.steady_load import SteadyLoad, unanswered
from tools.local import LocalCluster, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# A worker ready is in the gateway's rotation by its next probe (HEALTH_INTERVAL_S) and has answered
# a request within one request's time after that: this bound covers both on a loaded 2-core machine.
JOIN_BOUND_S = 20.0
DISCOVERY_INTERVAL_S = "0.5"


def gateway_workers(url: str) -> dict[str, dict]:
    """The gateway's workers by name (a discovered one: its address)."""
    body = requests.get(f"{url}/health", timeout=10).json()
    return {str(w["node"]): w for w in body.get("workers", [])}


def ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/ready", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_a_worker_joins_under_load_once_ready_and_a_leaving_one_drains_losing_nothing(support_data, tmp_path: Path):
    gateway_port, index_port, worker_port = free_ports(3)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 rag-index\n127.0.0.2 rag-worker\n")
    a, b = f"127.0.0.2:{worker_port}", f"127.0.0.3:{worker_port}"
    env = cluster_env(support_data, NODE_0_IP=f"127.0.0.1:{gateway_port}", NODE_2_IP=f"127.0.0.1:{index_port}",
                      NODE_1_IP=a, WORKER_DISCOVERY=f"rag-worker:{worker_port}",
                      INDEX_DISCOVERY=f"rag-index:{index_port}", DISCOVERY_HOSTS_FILE=str(hosts),
                      DISCOVERY_INTERVAL_S=DISCOVERY_INTERVAL_S, SHUTDOWN_GRACE_S="30", REQUEST_TIMEOUT_S="90")
    first = LocalCluster(env, tmp_path / "logs", launcher=forked_nodes.launch)
    second = LocalCluster({**env, "NODE_1_IP": b}, tmp_path / "logs-b", launcher=forked_nodes.launch)
    load = None
    try:
        first.start_node(2)
        first.start_node(1)
        first.start_node(0)
        first.wait_healthy([2, 1, 0], timeout_s=300)
        gateway = first.url(0)
        wait_until(lambda: gateway_workers(gateway).get(a, {}).get("up"), 30, "the gateway never routed to worker a")
        load = SteadyLoad(gateway, clients=3, prefix="elastic").start()
        wait_until(lambda: load.answered() >= 3, 120, "the load never got answers")

        # A second worker: listed before it is ready (as a compose service scaled up), routed to once it is.
        hosts.write_text("127.0.0.1 rag-index\n127.0.0.2 rag-worker\n127.0.0.3 rag-worker\n")
        second.start_node(1)
        wait_until(lambda: b in gateway_workers(gateway), 10, "the gateway never discovered worker b")
        assert not gateway_workers(gateway)[b]["up"] or ready(f"http://{b}"), "routed to before it was ready"
        wait_until(lambda: ready(f"http://{b}"), 300, f"worker b never became ready:\n{second.tail(1)}")
        became_ready = time.monotonic()
        wait_until(lambda: gateway_workers(gateway)[b]["forwarded"] > 0, JOIN_BOUND_S + 10,
                   "worker b did not serve after becoming ready", poll_s=0.1)
        join_s = time.monotonic() - became_ready
        print(f"worker b served {join_s:.1f} s after its /ready first answered 200 (bound {JOIN_BOUND_S:g} s)")
        assert join_s < JOIN_BOUND_S

        # The first worker leaves: SIGTERM drains it (new work refused, in-flight answered), then its name goes.
        served_by_a = gateway_workers(gateway)[a]["forwarded"]
        assert first.stop_node(1) == 0
        assert "stopped (in flight at exit: 0)" in first.log_path(1).read_text()
        hosts.write_text("127.0.0.1 rag-index\n127.0.0.3 rag-worker\n")
        wait_until(lambda: a not in gateway_workers(gateway), 10, "the gateway kept the worker that left")
        after = load.answered()
        wait_until(lambda: load.answered() >= after + 4, 120, "the load stalled after worker a left")
    finally:
        outcomes = load.stop() if load is not None else []
        second.stop()
        first.stop()
    lost = unanswered(outcomes)
    retried = sum(o.retried_503s for o in outcomes)
    print(f"{len(outcomes)} requests, {len(outcomes) - len(lost)} answered 200, {retried} 503s with Retry-After "
          f"retried; worker a answered {served_by_a} before it left")
    assert not lost, [(o.request_id, o.status, o.detail) for o in lost[:5]]
    assert served_by_a > 0
