"""tests/support/forked_nodes.py: a process forked from the fork server runs its module in its own
environment and log, and shows exit codes and signals as a plain process does; one whose environment
the preloaded libraries would have read otherwise is started plainly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from pipeline.config import REPO_ROOT
from tests.support import forked_nodes

pytestmark = pytest.mark.slow  # starts the fork server and forks processes


def _launch(tmp_path, name: str, **env: str):
    log = tmp_path / f"{name}.log"
    command = [sys.executable, "-m", "pipeline.config"]
    return forked_nodes.launch(command, {**os.environ, **env}, REPO_ROOT, log), log


def test_a_forked_process_runs_its_module_in_its_own_environment_and_exit_code(tmp_path):
    good, good_log = _launch(tmp_path, "good", TORCH_THREADS="3")
    bad, bad_log = _launch(tmp_path, "bad", TORCH_THREADS="abc")
    assert isinstance(good, forked_nodes.ForkedNode) and isinstance(bad, forked_nodes.ForkedNode)
    assert good.wait(timeout=60) == 0 and bad.wait(timeout=60) == 2
    assert "TORCH_THREADS=3 " in good_log.read_text()
    assert "TORCH_THREADS='abc' is not valid" in bad_log.read_text()


def test_signals_reach_a_forked_process_and_its_code_says_which(tmp_path):
    # `python -m http.server` serves until signalled: SIGKILL gives -9, as Popen.returncode would say.
    server = forked_nodes.server()
    log = tmp_path / "http.log"
    proc = server.fork([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], dict(os.environ), tmp_path,
                       log)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL and proc.returncode == -signal.SIGKILL


def test_many_forks_at_once_each_get_their_own_process(tmp_path):
    results: dict[int, object] = {}

    def start(i: int) -> None:
        results[i] = _launch(tmp_path, f"p{i}", TORCH_THREADS=str(i + 1))[0]

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    pids = {proc.pid for proc in results.values()}
    assert len(pids) == 8
    assert all(proc.wait(timeout=60) == 0 for proc in results.values())
    for i in range(8):
        assert f"TORCH_THREADS={i + 1} " in (tmp_path / f"p{i}.log").read_text()


def test_what_the_libraries_set_in_a_runner_that_used_them_does_not_stop_a_fork(tmp_path):
    """A runner that loaded models in-process after the server started has these; the server has not."""
    server_env = forked_nodes.server().env
    used = {"KMP_INIT_AT_FORK": "FALSE", "KMP_DUPLICATE_LIB_OK": "True", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    proc, _ = _launch(tmp_path, "used", **{k: v + "-other" if k in server_env else v for k, v in used.items()})
    assert isinstance(proc, forked_nodes.ForkedNode)
    assert proc.wait(timeout=60) == 0


def test_an_environment_the_preloaded_libraries_read_otherwise_gets_a_plain_process(tmp_path):
    proc, log = _launch(tmp_path, "hub", HF_HUB_OFFLINE="0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=60) == 0


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _fork_http_server(server: forked_nodes.ForkServer, log):
    return server.fork([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], dict(os.environ),
                       log.parent, log)


@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason=f"{NS_LAST_PID} is not writable here (root only)")
def test_a_node_given_an_exited_nodes_pid_is_not_seen_as_exited(tmp_path):
    """A long run forks enough processes to wrap the kernel's pids: a node that got the pid of one that had
    exited was read as exited (code 0, empty log) at once. Here the kernel is asked for that pid again."""
    server = forked_nodes.server()
    for attempt in range(20):  # another process on the machine may take the pid first
        first, _ = _launch(tmp_path, f"first{attempt}")
        assert first.wait(timeout=60) == 0
        with open(NS_LAST_PID, "w") as last_pid:
            last_pid.write(str(first.pid - 1))
        second = _fork_http_server(server, tmp_path / f"second{attempt}.log")
        if second.pid == first.pid:
            break
        second.kill()
        second.wait(timeout=30)
    else:
        pytest.skip("the kernel never gave the pid again in 20 tries")
    try:
        assert second.poll() is None and second.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=0.5)
        assert first.returncode == 0
    finally:
        second.kill()
    assert second.wait(timeout=30) == -signal.SIGKILL and first.returncode == 0


# A fork server that reports two children with one pid, as a server whose first child exited and whose
# pid the kernel then gave to its second does: deterministic where ns_last_pid cannot be written.
PID_REUSING_SERVER = """
import json, sys
def send(message):
    print(json.dumps(message), flush=True)
send({"ready": 1})
sys.stdin.readline(); send({"pid": 4242})
sys.stdin.readline(); send({"exited": 0, "code": 0}); send({"pid": 4242})
sys.stdin.read()
"""


def test_the_client_names_children_by_request_so_a_reused_pid_shows_only_its_own_exit(tmp_path):
    server = forked_nodes.ForkServer(os.environ, server_command=("-c", PID_REUSING_SERVER))
    try:
        first = server.fork([sys.executable, "-m", "x"], dict(os.environ), tmp_path, tmp_path / "first.log")
        second = server.fork([sys.executable, "-m", "x"], dict(os.environ), tmp_path, tmp_path / "second.log")
        assert first.pid == second.pid == 4242
        assert first.wait(timeout=30) == 0
        assert second.poll() is None
    finally:
        server.close()
