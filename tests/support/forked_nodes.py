"""Nodes forked from tests/support/fork_server.py instead of started afresh: the launcher the tests'
LocalClusters use (`LocalCluster(..., launcher=forked_nodes.launch)`). A forked node runs the same module, in the
same environment, folder and log file, and answers poll/wait/signals as a Popen does; it only skips
re-importing torch, transformers and sentence-transformers (about 4.5 s of CPU per worker).

A node whose command is not `python -m module ...` with this Python, or whose environment differs from
the server's on what those libraries read when imported (fork_server.PRELOAD_ENV_PREFIXES; a hub-mode
node, say), is started as a plain process, as LocalCluster would.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.config import Settings
from tests.support.fork_server import PRELOAD_ENV_PREFIXES
from tools.local import NodeProcess, popen_node

SERVER_START_TIMEOUT_S = 120
# The project's own settings that share a prefix with the libraries' (TORCH_THREADS): read by the node,
# after the fork. HF_HUB_OFFLINE is also huggingface_hub's, read when it is imported: it must agree.
OURS = {name for name in Settings.variables() if not name.startswith("HF_")}
# Set in a process by the libraries themselves once it has used them (OpenMP's fork handling, the
# faiss loader's, torch inductor's cache folder), not by whoever starts a node: a runner that loaded
# models in-process after the server started has them and the server's environment has not, which
# says nothing of how the preloaded libraries were imported.
SET_BY_THE_LIBRARIES = {"KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK", "TORCHINDUCTOR_CACHE_DIR"}


class ForkedNode:
    """A forked node, seen as subprocess.Popen shows a child: pid, poll, wait, returncode, signals."""

    def __init__(self, server: "ForkServer", number: int, pid: int, args: list[str]):
        # `number`: the server's name for this child (its request's place in order); a pid can name
        # a later process once this one has exited.
        self._server, self._number, self.pid, self.args = server, number, pid, args

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self._number)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self._number, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    def __init__(self, env: Mapping[str, str], python: str = sys.executable,
                 server_command: Sequence[str] = ("-m", "tests.support.fork_server")):
        self.env, self.python = dict(env), python
        self._proc = subprocess.Popen([python, *server_command], env=self.env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._lock = threading.Lock()  # one request at a time: replies come in request order
        self._changed = threading.Condition()
        self._pids: list[int] = []  # by request number
        self._exits: dict[int, int] = {}  # request number -> exit code
        self._ready = threading.Event()
        self.closed = False  # the server exited (its children with it)
        self._reader = threading.Thread(target=self._read, name="fork-server-reader", daemon=True)
        self._reader.start()
        if not self._ready.wait(SERVER_START_TIMEOUT_S):
            self.close()
            raise RuntimeError("the fork server did not import its libraries in time")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "ready" in message:
                    self._ready.set()
                elif "pid" in message:
                    self._pids.append(message["pid"])
                elif "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                self._changed.notify_all()
        with self._changed:  # the server is gone: so are its children (PR_SET_PDEATHSIG)
            self.closed = True
            self._changed.notify_all()

    def agrees(self, command: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a node with this command and environment can be forked from this server."""
        if len(command) < 3 or command[0] != self.python or command[1] != "-m" or self.closed:
            return False
        keys = {k for k in (*env, *self.env) if k.startswith(PRELOAD_ENV_PREFIXES)} - OURS - SET_BY_THE_LIBRARIES
        return all(env.get(k) == self.env.get(k) for k in keys)

    def fork(self, command: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> ForkedNode:
        request = {"argv": list(command[1:]), "env": dict(env), "cwd": str(cwd), "log": str(log)}
        with self._lock, self._changed:
            assert self._proc.stdin is not None
            seen = len(self._pids)
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            if not self._changed.wait_for(lambda: len(self._pids) > seen or self.closed, timeout=30):
                raise RuntimeError("the fork server did not fork")
            if self.closed:
                raise RuntimeError("the fork server exited")
            return ForkedNode(self, seen, self._pids[seen], list(command))

    def exit_code(self, number: int) -> int | None:
        with self._changed:
            return self._exits.get(number)

    def wait_exit(self, number: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: number in self._exits or self.closed, timeout)
            return self._exits.get(number)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def server() -> ForkServer:
    """The session's fork server, started on first use with this process's environment."""
    global _server
    with _server_lock:
        if _server is None or _server.closed:
            _server = ForkServer(os.environ)
            atexit.register(_server.close)
        return _server


def launch(command: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> NodeProcess:
    """LocalCluster's launcher: a forked node where it can be, else a plain process."""
    forks = server()
    if forks.agrees(command, env):
        return forks.fork(command, env, cwd, log)
    return popen_node(command, env, cwd, log)
