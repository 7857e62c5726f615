"""A node's end on real processes (127.0.0.1, tiny stand-ins): a dying stage thread, SIGTERM with
requests still in flight past SHUTDOWN_GRACE_S, and the local launcher restarting a killed node.

Every request in these tests must get one HTTP answer (never a closed connection), and every
wait is bounded. The module's cluster has a short grace so its deadline comes in seconds; its node 2
(tests.support.slow_index_node) holds searches while a test needs requests in flight. Node 1 is
stopped first and started again as the dying worker (so it is started twice, not three times);
node 0 is stopped last. The supervisor test runs `python -m tools.local` itself.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from pipeline import spec
from pipeline.config import REPO_ROOT
from tests.helpers import cluster_env, start_cluster, uid, wait_until
from tests.support import SlowIndex, failing_generate_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GRACE_S = 2.0
REQUEST_TIMEOUT_S = 60.0
STOPPING = ("stopping", "shutting down")


@pytest.fixture(scope="module")
def slow_index(tmp_path_factory) -> SlowIndex:
    return SlowIndex(tmp_path_factory.mktemp("shutdown-index") / "delay_ms")


@pytest.fixture(scope="module")
def cluster(course_data, tmp_path_factory, slow_index):
    cluster = start_cluster(course_data, tmp_path_factory.mktemp("shutdown-logs"), commands={2: slow_index.command()},
                            SHUTDOWN_GRACE_S=str(GRACE_S), REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S))
    yield cluster
    cluster.stop()


def get_health(url: str) -> requests.Response:
    return requests.get(f"{url}/health", timeout=10)


def restart(cluster, node: int, command: list[str] | None = None) -> None:
    """Replace a node's process, started by `command` (a tests.support node) or as usual."""
    cluster.kill_node(node)
    cluster.start_node(node, command=command)
    cluster.wait_healthy(nodes=(node,), timeout_s=120)


def running(cluster, node: int) -> None:
    """`node` started as usual unless it runs (an earlier test stopped it), and healthy."""
    if node not in cluster.procs:
        cluster.start_node(node)
        cluster.wait_healthy(nodes=(node,), timeout_s=120)


def assert_stopping_503(response: requests.Response) -> None:
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    assert int(response.headers["Retry-After"]) >= 1
    assert any(word in response.json()["error"] for word in STOPPING), response.text[:300]


class Clients:
    """Requests sent from threads; each records its response or the exception it got."""

    def __init__(self):
        self.results: dict[int, object] = {}
        self.threads: list[threading.Thread] = []

    def send(self, i: int, url: str, body: dict, timeout_s: float = 90) -> None:
        def run():
            try:
                self.results[i] = requests.post(url, json=body, timeout=timeout_s)
            except requests.RequestException as exc:
                self.results[i] = exc
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client is still waiting"
        return [self.results[i] for i in sorted(self.results)]


# ---------------------------------------------------------------- item 3: SIGTERM with requests in flight

def test_sigterm_node_1_answers_requests_in_flight_at_the_grace_deadline_with_503(cluster, slow_index):
    running(cluster, 1)
    url, clients = cluster.url(1), Clients()
    with slow_index.held():  # the searches outlast the grace: the requests are surely still in flight
        before = _reached_search(url)
        for i in range(2):
            clients.send(i, f"{url}/internal/answer", {"request_id": uid(f"n1-{i}"), "query": f"Order {i} is late?"})
        wait_until(lambda: _reached_search(url) == before + 2, 20, "the requests did not reach the search stage")
        sigterm_and_check_every_client_got_503(cluster, 1, clients)
    cluster.procs.pop(1)  # stopped: the next test starts it as the dying worker


def sigterm_and_check_every_client_got_503(cluster, node: int, clients: Clients) -> None:
    """SIGTERM `node` while `clients` wait on it: each gets a 503 JSON naming the stop (no cut
    connection) soon after the grace, and the node exits 0 promptly."""
    proc = cluster.procs[node]
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    for response in clients.join(30):
        assert isinstance(response, requests.Response), f"a client got {response!r} instead of an answer"
        assert_stopping_503(response)
    assert proc.wait(timeout=20) == 0
    assert time.monotonic() - signalled < GRACE_S + 15


def _reached_search(url: str) -> int:
    """Items the worker's search stage has taken or holds: requests waiting on node 2."""
    search = get_health(url).json()["stages"]["search"]
    return search["items"] + search["queue_depth"]


# ---------------------------------------------------------------- item 4: a stage thread that dies

def test_a_dead_generate_loop_fails_its_requests_at_once_and_health_says_unhealthy(cluster):
    restart(cluster, 1, failing_generate_command(cluster.python))
    cluster.wait_rotation(timeout_s=120)  # in node 0's rotation again: its probe is what must take it out
    try:
        _check_a_dead_stage(cluster, cluster.url(1))
    finally:
        restart(cluster, 1)


def _check_a_dead_stage(cluster, url: str) -> None:
    body = {"request_id": uid("dead"), "query": spec.REFERENCE_QUERIES[0], "timeout_s": 30}
    started = time.monotonic()
    first = requests.post(f"{url}/internal/answer", json=body, timeout=45)
    assert time.monotonic() - started < 15, "the request waited for its deadline: the loop died silently"
    # Its own iteration failed: 500 for it (a stage failing one request); the stage then died.
    assert first.status_code == 500 and "generate" in first.json()["error"], first.text[:300]
    health = get_health(url)
    assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text[:300]
    assert "generate" in health.json()["detail"]
    started = time.monotonic()
    again = requests.post(f"{url}/internal/answer", json={**body, "request_id": uid("dead")}, timeout=45)
    assert again.status_code == 503 and time.monotonic() - started < 5, again.text[:300]  # refused at once
    assert "generate" in again.json()["error"] and int(again.headers["Retry-After"]) >= 1
    # The gateway's probe takes node 1 out of rotation; node 0's own worker serves.
    wait_until(lambda: not {w["node"]: w["up"] for w in get_health(cluster.url(0)).json()["workers"]}[1],
               10, "node 1 stayed in the rotation")
    for i in range(2):
        r = requests.post(f"{cluster.url(0)}/query", json={"request_id": uid("rotate"),
                                                           "query": spec.REFERENCE_QUERIES[i]}, timeout=60)
        assert r.status_code == 200 and r.json()["served_by"] == 0, r.text[:300]


# ---------------------------------------------------------------- item 3 on node 0 (stops it: last)

def test_sigterm_node_0_answers_every_request_in_flight_with_503_and_exits_0(cluster, slow_index):
    n = 4  # round robin: two on node 0's own worker, two forwarded to node 1
    running(cluster, 1)
    wait_until(lambda: all(w["up"] for w in get_health(cluster.url(0)).json()["workers"]), 20,
               "node 1 not back in the rotation")
    clients = Clients()
    with slow_index.held():  # the searches outlast the grace: the requests are surely still in flight
        for i in range(n):
            clients.send(i, f"{cluster.url(0)}/query", {"request_id": uid(f"n0-{i}"),
                                                        "query": spec.REFERENCE_QUERIES[i]})
        wait_until(lambda: get_health(cluster.url(0)).json()["gateway"]["in_flight"] == n, 10,
                   "requests not in flight")
        sigterm_and_check_every_client_got_503(cluster, 0, clients)
    cluster.procs.pop(0)
    assert cluster.procs[1].poll() is None and cluster.procs[2].poll() is None


# ---------------------------------------------------------------- item 9: the launcher as a supervisor

def node_pid(launcher: subprocess.Popen, node: int) -> int | None:
    """The pid of the launcher's child running `node` (its NODE_NUMBER), if it is alive."""
    for child in psutil.Process(launcher.pid).children():
        try:
            if child.environ().get("NODE_NUMBER") == str(node) and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.Error:
            continue
    return None


def query(url: str, i: int) -> requests.Response:
    return requests.post(f"{url}/query", json={"request_id": uid(f"sup-{i}"),
                                               "query": spec.REFERENCE_QUERIES[i % 8]}, timeout=60)


def test_local_launcher_restarts_a_killed_node_while_the_others_keep_serving(course_data, tmp_path: Path):
    env = cluster_env(course_data, LOCAL_RESTART_LIMIT="3", LOCAL_RESTART_WINDOW_S="300")
    urls = [f"http://{env[f'NODE_{i}_IP']}" for i in range(3)]
    out = open(tmp_path / "launcher.out", "wb")
    launcher = subprocess.Popen([sys.executable, "-m", "tools.local", "--log-dir", str(tmp_path / "logs")],
                                env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: b"READY" in (tmp_path / "launcher.out").read_bytes(), 240, "launcher not ready", 0.2)
        old = node_pid(launcher, 1)
        assert old is not None
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: get_health(urls[0]).json()["workers"][1]["up"] is False or node_pid(launcher, 1) != old,
                   10, "node 1's death went unnoticed")
        for i in range(3):  # failover: node 0 keeps answering while node 1 is down or restarting
            r = query(urls[0], i)
            assert r.status_code == 200, r.text[:300]
        assert launcher.poll() is None, (tmp_path / "launcher.out").read_text()
        wait_until(lambda: node_pid(launcher, 1) not in (None, old) and _healthy(urls[1]), 120,
                   "node 1 was not restarted", 0.2)
        wait_until(lambda: any(query(urls[0], i).json().get("served_by") == 1 for i in range(2)), 30,
                   "node 1 did not rejoin the rotation", 0.2)
        pids = [node_pid(launcher, node) for node in (0, 1, 2)]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 0
        assert not [pid for pid in pids if pid is not None and _alive(pid)], "a node outlived its launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        out.close()


def _healthy(url: str) -> bool:
    try:
        return get_health(url).status_code == 200
    except requests.RequestException:
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
