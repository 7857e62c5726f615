"""/live, /ready, /settings and a failed start, on real node processes (127.0.0.1)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from pipeline.config import REPO_ROOT, Settings
from pipeline.models import ALL_MODELS, fetch_command
from services.server.lifecycle import CONFIG_ERROR_EXIT
from tests.helpers import TEST_ENV, data_env
from tools.local import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

POLL_S = 0.1
# Importing torch and transformers before the HTTP server is up takes seconds alone, minutes on a
# loaded 2-core machine: a generous bound that no behaviour under test depends on.
START_S = 240
# The failed node's linger: long enough for a 0.1 s poll to see it, short enough not to wait for nothing.
LINGER_S = 2.0


def start_node(node: int, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_ports(1)[0]
    full = {"PATH": os.environ["PATH"], "NODE_NUMBER": str(node), f"NODE_{node}_IP": f"127.0.0.1:{port}",
            "TORCH_THREADS": "1", "FAISS_THREADS": "1", **env}
    with open(log, "wb") as out:  # a file, not a pipe: a chatty node never blocks on a full pipe
        proc = subprocess.Popen([sys.executable, "-m", "services.node"], env=full, cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def get(url: str) -> requests.Response | None:
    try:
        return requests.get(url, timeout=5)
    except requests.ConnectionError:
        return None


def answer(url: str, check) -> list[requests.Response]:
    """[the response] when `check(its JSON)` holds, else [] (a list: a 503 Response itself is falsy)."""
    response = get(url)
    return [response] if response is not None and check(response.json()) else []


def poll(proc: subprocess.Popen, until, timeout_s: float, what: str, log: Path):
    """Call `until()` every POLL_S until it returns something truthy; fail if the node exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = until()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"node exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(POLL_S)
    pytest.fail(f"no {what} within {timeout_s}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


# No hub: one that refuses connections (port 9 on 127.0.0.1, the same with or without internet), or
# HF_HUB_OFFLINE; each with the reason the node's one line gives.
NO_HUB = {"unreachable": ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "the hub (http://127.0.0.1:9) cannot be reached"),
          "offline": ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set")}


@pytest.mark.parametrize("no_hub", list(NO_HUB))
def test_hub_node_without_models_or_hub_fails_in_seconds_in_one_line_saying_failed_until_it_exits(
        course_data, tmp_path, no_hub):
    # An empty cache and no hub. Before: a minute of retries per file, each warning twice, then a
    # misleading traceback.
    no_hub_env, why = NO_HUB[no_hub]
    env = {**data_env(course_data), "MODEL_SOURCE": "hub", "ONLY_CPU": "true", "HF_HOME": str(tmp_path / "hf"),
           "FAILED_LINGER_S": str(LINGER_S), **no_hub_env}
    log = tmp_path / "node1.log"
    proc, url = start_node(1, env, log)
    try:
        poll(proc, lambda: get(f"{url}/live"), START_S, "/live answering", log)
        served_at = time.monotonic()
        [health] = poll(proc, lambda: answer(f"{url}/health", lambda body: body["status"] == "failed"),
                        30, "/health saying failed", log)
        assert health.status_code == 503
        detail = health.json()["detail"]
        ready, live = get(f"{url}/ready"), get(f"{url}/live")
        assert ready.status_code == 503 and ready.json() == {"ready": False, "status": "failed", "node": 1,
                                                             "detail": detail}
        assert live.status_code == 200 and live.json()["status"] == "live"
        code = proc.wait(timeout=LINGER_S + 30)
        exited_at = time.monotonic()
    finally:
        stop(proc)
    text = log.read_text()
    assert code == CONFIG_ERROR_EXIT, text  # a restart cannot fetch models: ./run.sh local gives up on it
    # in seconds: HTTP up to exit is the failed-state linger plus a little, not a minute of retries
    assert exited_at - served_at < LINGER_S + 15, text
    assert f"answers /health 'failed' for {LINGER_S:g} s, then exits {CONFIG_ERROR_EXIT}" in text  # FAILED_LINGER_S
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text
    for name in ALL_MODELS:  # the cache is empty: every model named, each with its command
        assert name in errors[0] and fetch_command(name) in errors[0] and fetch_command(name) in detail
    assert why in errors[0] and why in detail and str(tmp_path / "hf") in errors[0]
    assert "Traceback" not in text and "Retrying" not in text and "WARNING huggingface_hub" not in text


def test_a_ready_node_answers_live_ready_and_its_settings_with_secrets_hidden(course_data, tmp_path):
    env = {**TEST_ENV, **data_env(course_data), "HF_HUB_OFFLINE": "1", "CLUSTER_TOKEN": "s3cret-token",
           "EMBED_MAX_BATCH": "8", "GENERTE_MAX_BATCH": "4", "SHUTDOWN_GRACE_S": "1"}
    log = tmp_path / "node2.log"
    proc, url = start_node(2, env, log)
    try:
        poll(proc, lambda: get(f"{url}/live"), START_S, "/live answering", log)
        [ready] = poll(proc, lambda: answer(f"{url}/ready", lambda body: body["ready"]), START_S, "/ready 200", log)
        assert ready.json() == {"ready": True, "status": "healthy", "node": 2}
        assert get(f"{url}/health").status_code == 200 and get(f"{url}/live").status_code == 200
        settings = get(f"{url}/settings")
        assert settings.status_code == 200
        body = settings.json()
        assert list(body) == ["settings"] and set(body["settings"]) == set(Settings.variables())
        shown = body["settings"]
        assert all(isinstance(v, str) for v in shown.values())
        assert shown["CLUSTER_TOKEN"] == "<hidden>" and "s3cret-token" not in settings.text
        assert (shown["EMBED_MAX_BATCH"], shown["NODE_NUMBER"], shown["MODEL_SOURCE"]) == ("8", "2", "standin")
    finally:
        stop(proc)
    text = log.read_text()
    [line] = [line for line in text.splitlines() if "settings not at their default:" in line]
    assert "EMBED_MAX_BATCH=8" in line and "CLUSTER_TOKEN=<hidden>" in line and "NODE_NUMBER=2" in line
    assert "s3cret-token" not in text
    [warning] = [line for line in text.splitlines() if "GENERTE_MAX_BATCH" in line]
    assert " WARNING " in warning and "did you mean GENERATE_MAX_BATCH?" in warning


def test_bind_host_is_where_a_node_listens_while_its_node_ip_is_where_others_reach_it(course_data, tmp_path):
    """As in a container: the node listens on BIND_HOST (here 127.0.0.2), not on its NODE_<n>_IP's host."""
    env = {**TEST_ENV, **data_env(course_data), "HF_HUB_OFFLINE": "1", "BIND_HOST": "127.0.0.2",
           "SHUTDOWN_GRACE_S": "1"}
    log = tmp_path / "node2.log"
    proc, advertised = start_node(2, env, log)
    bound = advertised.replace("127.0.0.1", "127.0.0.2")
    try:
        poll(proc, lambda: answer(f"{bound}/ready", lambda body: body["ready"]), START_S, "/ready 200 on BIND_HOST", log)
        assert get(f"{advertised}/live") is None  # nothing listens on the advertised host here
    finally:
        stop(proc)
    assert f"listening on 127.0.0.2:{bound.rsplit(':', 1)[1]}" in log.read_text()
