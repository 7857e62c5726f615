"""Helpers the tests share (imported, unlike fixtures): the test environment, a real local cluster,
waits on conditions, and the guard that keeps the fast subset free of processes."""
from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import requests

from tests.support import forked_nodes
from tools.local import LocalCluster, free_ports

# What every test runs with: tiny stand-ins, float32 on the CPU (the oracle's precision).
# FAILED_LINGER_S: a node whose load fails (as several tests make one) exits after 0.5 s, not 5.
TEST_ENV = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "PRECISION": "float32", "ONLY_CPU": "true",
            "FAILED_LINGER_S": "0.5"}


def data_env(result) -> dict[str, str]:
    """The environment that points a node at a built data set (index file and documents folder)."""
    return {"FAISS_INDEX_PATH": str(result.index_path), "DOCUMENTS_DIR": str(result.db_path.parent)}


def cluster_env(data, **extra: str) -> dict[str, str]:
    """The environment of a cluster on 127.0.0.1 with free ports: three nodes, or as many as the
    TOTAL_NODES in `extra` (tools.local.local_topology lays out more)."""
    ports = free_ports(int(extra.get("TOTAL_NODES", 3)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NODE_", "FAISS_", "DOCUMENTS_", "INDEX_", "TOTAL_NODES", "WORKER_NODES"))}
    env.update(TEST_ENV)
    env.update(data_env(data))
    env.update({f"NODE_{i}_IP": f"127.0.0.1:{port}" for i, port in enumerate(ports)})
    env.update({"TORCH_THREADS": "1", "FAISS_THREADS": "1", "HEALTH_INTERVAL_S": "0.5", "LOG_LEVEL": "info"})
    env.update(extra)
    return env


def start_cluster(data, log_dir: Path, *, commands: Mapping[int, Sequence[str]] | None = None,
                  **extra: str) -> LocalCluster:
    """Real node processes on 127.0.0.1 (free ports), healthy; the caller stops them. Three nodes, or
    the topology `extra` sets (TOTAL_NODES, INDEX_NODES, INDEX_SHARDS: local_topology).

    `commands`: a node's own command line (tests.support's wrapped nodes), by node number."""
    cluster = LocalCluster(cluster_env(data, **extra), log_dir, launcher=forked_nodes.launch)
    try:
        if commands:
            for node in cluster.start_order:  # the index first, workers search it at once
                cluster.start_node(node, command=commands.get(node))
            cluster.wait_healthy(timeout_s=240)
            cluster.wait_rotation(timeout_s=240)
        else:
            cluster.start(timeout_s=240)
    except Exception:
        cluster.stop()
        raise
    return cluster


def post_query(target: LocalCluster | str, request_id: str, query: str = "Where is my order?",
               timeout: float = 180) -> requests.Response:
    """POST /query to node 0: `target` is a running cluster or node 0's base URL."""
    url = target if isinstance(target, str) else target.url(0)
    return requests.post(f"{url}/query", json={"request_id": request_id, "query": query}, timeout=timeout)


def health(cluster: LocalCluster, node: int) -> dict:
    """A node's /health body, whatever its status."""
    return requests.get(f"{cluster.url(node)}/health", timeout=10).json()


def uid(prefix: str) -> str:
    """A request id no earlier request of the run used."""
    return f"{prefix}-{time.time_ns()}"


class InProcessIndex:
    """What a worker asks of node 2 (ShardedIndexClient.search), answered by the index itself."""

    def __init__(self, index):
        self.index = index

    def search(self, vectors, k, **_context):
        ids, distances = self.index.search(vectors, k)
        return ids.tolist(), distances.tolist()

    def close(self) -> None:
        pass


def wait_until(condition: Callable[[], object], timeout_s: float, what: str | Callable[[], str],
               poll_s: float = 0.05) -> None:
    """Poll `condition` until it holds; fail with `what` past timeout_s (a bound, not a pace). `what`
    may be a function, called only then (a message that reads logs)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(poll_s)


def engine_requests() -> tuple[tuple, list]:
    """(documents, requests): five SPEC queries with none to three short documents, what the continuous
    engine's and the generate stage's tests ask (their answers alone: conftest's reference_texts)."""
    from pipeline import spec
    from pipeline.docstore import Document
    from pipeline.generator import GenerationRequest
    docs = tuple(Document(i, f"Document {i}", "Refunds are issued within 5 days. " * (i + 1), "billing")
                 for i in range(3))
    return docs, [GenerationRequest(q, docs[: i % 4]) for i, q in enumerate(spec.REFERENCE_QUERIES[:5])]


def blocked_in(thread: threading.Thread | None, function: str) -> dict | None:
    """The locals of the threading wait (Condition or Event) `thread` is in now, when `function` is on
    its stack below it; else None. White-box (its stack): "it is waiting there" without a sleep."""
    ident = thread.ident if thread is not None else None
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None or frame.f_code.co_name != "wait" or frame.f_code.co_filename != threading.__file__:
        return None
    caller = frame.f_back
    while caller is not None:
        if caller.f_code.co_name == function:
            return dict(frame.f_locals)
        caller = caller.f_back
    return None


def leftovers(out_dir: Path) -> list[Path]:
    """Every file under a folder: what a failed or refused build left behind."""
    return [p for p in out_dir.rglob("*") if p.is_file()]


class ManualClock:
    """A clock a test moves by hand (`clock.now += 1`): time-dependent code without sleeps."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_joining(engine, requests: Sequence, join_every: int = 1) -> list:
    """Step a ContinuousEngine until it is idle, request i joining `join_every` steps after request
    i - 1; each request's sequence, in the requests' order. Fails on any failed sequence."""
    seqs, pending, step = {}, list(enumerate(requests)), 0
    while pending or engine.has_work():
        if pending and step % join_every == 0:
            i, request = pending.pop(0)
            seqs[i] = engine.add(request)
        assert not engine.step().failed
        step += 1
    return [seqs[i] for i in range(len(requests))]



def _command(args) -> str:
    """A process's command line as one readable string (subprocess takes a string, bytes, a path or a list)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args)
    return " ".join(os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args)


@contextlib.contextmanager
def no_processes(who: str) -> Iterator[list[str]]:
    """While inside, starting a process fails with pytest's Failed naming `who` and the command: every
    way Python starts one (subprocess and everything built on it, os.fork/forkpty/posix_spawn/system,
    multiprocessing). Yields the commands refused, so a refusal a caller caught is still seen.

    Failed is a BaseException: an `except Exception` in the code under test does not swallow it."""
    refused: list[str] = []

    def refuse(command: str):
        refused.append(command)
        pytest.fail(f"{who} started a process: {command}")

    def execute_child(self, args, *rest, **kwargs):
        refuse(_command(args))

    def spawn(path, argv, *rest, **kwargs):
        refuse(_command(argv))

    def start(self):
        refuse(f"multiprocessing {self.name} (target {getattr(self, '_target', None)!r})")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", execute_child)
        patch.setattr(os, "fork", lambda: refuse("os.fork()"))
        patch.setattr(os, "forkpty", lambda: refuse("os.forkpty()"))
        patch.setattr(os, "posix_spawn", spawn)
        patch.setattr(os, "posix_spawnp", spawn)
        patch.setattr(os, "system", lambda command: refuse(_command(command)))
        patch.setattr(multiprocessing.process.BaseProcess, "start", start)
        yield refused


# The commit profiling's tools record in a test not marked slow: provenance.git_commit runs git, a
# process. The real git_commit is tested alone, slow (tests/unit/test_provenance.py).
TOOL_COMMIT = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False}


@contextlib.contextmanager
def recording_tool_commit() -> Iterator[dict]:
    """While inside, profiling's tools record TOOL_COMMIT as their code's commit; yields it."""
    from profiling.lib import provenance
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(provenance, "git_commit", lambda cwd=None: dict(TOOL_COMMIT))
        yield TOOL_COMMIT


@contextlib.contextmanager
def index_node_app(faiss_index_path: Path, **env: str) -> Iterator[tuple]:
    """Node 2's role and a Flask test client of its app, in this process, serving the data version whose
    index file is `faiss_index_path` (its manifest's serving values; `env`: more settings), ready; the
    index closed after."""
    from pipeline.config import Settings
    from services.roles.index.role import IndexRole
    from services.server.lifecycle import Lifecycle, Readiness
    from services.server.routes import build_app
    settings = Settings.from_env({"FAISS_INDEX_PATH": str(faiss_index_path), "NODE_NUMBER": "2", **env})
    lifecycle = Lifecycle("node 2", 0.0, exit=lambda code: None)
    role = IndexRole(settings, 2, lifecycle)
    app = build_app(role, lifecycle)
    role.load()
    lifecycle.readiness.set(Readiness.READY)
    try:
        yield role, app.test_client()
    finally:
        role.data.require().close()
