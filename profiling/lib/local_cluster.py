"""A local cluster for the check tools: its ports, its start through the launcher's command line, the wait for its workers, its stop."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = "tools.local"  # the local launcher (./run.sh local), run by its command line


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start(env: dict[str, str], log_dir: Path, log) -> tuple[subprocess.Popen, list[int]]:
    """The three nodes on free ports of 127.0.0.1 (their logs in `log_dir`, the launcher's in `log`);
    returns the launcher and the ports, node 0's first."""
    ports = free_ports(3)
    env = {**env, **{f"NODE_{n}_IP": f"127.0.0.1:{p}" for n, p in enumerate(ports)}}
    nodes = subprocess.Popen([sys.executable, "-m", LAUNCHER, "--log-dir", str(log_dir)], cwd=ROOT, env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return nodes, ports


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float, logs: str) -> dict:
    """Node 0's /health body once it names its workers and every one is up; RuntimeError naming `logs` where the
    launcher exits first (the wait's own error past `timeout_s`)."""
    from services.cluster.health_wait import wait_healthy

    def launcher_alive() -> None:
        if process.poll() is not None:
            raise RuntimeError(f"the cluster exited with {process.returncode}: see {logs}")
    return wait_healthy(url, timeout_s, poll_s=0.5, check=launcher_alive,
                        ready=lambda body: bool(body.get("workers")) and all(w.get("up") for w in body["workers"]))


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (the launcher stops its nodes gracefully), then SIGKILL to the group past a minute."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
