"""The cluster's nodes as separate processes on 127.0.0.1: `./run.sh local`.

Three nodes by default (gateway+worker, worker, index); --workers, --index-shards and
--index-replicas (or LOCAL_WORKERS, LOCAL_INDEX_SHARDS, LOCAL_INDEX_REPLICAS) lay out more
(local_topology). Used by the demo, the tests and the load generator; it builds the stand-ins
the nodes would read when they are missing (a serving node never builds models). Each node logs to its own
file under one folder; the children die with the parent (PR_SET_PDEATHSIG),
and Ctrl-C or SIGTERM stops them all gracefully. While it runs, `main` supervises:
a node that dies is logged and restarted (--restart-limit per --restart-window-s),
and the others keep serving meanwhile, so failover and rejoin can be watched.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from pipeline.config import REPO_ROOT, ConfigError, Settings
from pipeline.device import thread_budget
from services.cluster.health_wait import health, wait_healthy
from services.server.lifecycle import ANSWER_WINDOW_S, CONFIG_ERROR_EXIT, EXIT_LINGER_S

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
# A node SIGTERMed exits by SHUTDOWN_GRACE_S + its answer window + linger; SIGKILL only past this margin.
STOP_MARGIN_S = ANSWER_WINDOW_S + EXIT_LINGER_S + 5
# How often the supervisor looks at its nodes.
SUPERVISE_POLL_S = 0.5
# How long the launcher waits for every node to answer /health 200 (a node loads its models in minutes).
STARTUP_TIMEOUT_S = 300.0
# A node that died is restarted at most this often within the window; beyond, it is given up on.
RESTART_LIMIT, RESTART_WINDOW_S = 5, 600.0


def die_with_parent() -> None:
    """In a child: SIGTERM when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the parent's stop() still cleans up


def popen_node(command: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """A node process: `command` in `env` and `cwd`, its output appended to `log`; it dies with its parent."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(command), env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


class NodeProcess(Protocol):
    """What LocalCluster needs of a node's process (subprocess.Popen has it)."""
    pid: int

    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


# How a node's process is started: (command, environment, working folder, log file) -> its process.
Launcher = Callable[[Sequence[str], Mapping[str, str], Path, Path], NodeProcess]


class LocalCluster:
    def __init__(self, env: Mapping[str, str], log_dir: Path, python: str = sys.executable,
                 launcher: Launcher = popen_node):
        self.env = dict(env)
        self.settings = Settings.from_env(self.env)
        self.log_dir = Path(log_dir)
        self.python = python
        self.launcher = launcher
        self.procs: dict[int, NodeProcess] = {}

    def url(self, node: int) -> str:
        return self.settings.node_address(node).url

    def log_path(self, node: int) -> Path:
        return self.log_dir / f"node{node}.log"

    def start_node(self, node: int, *, command: Sequence[str] | None = None) -> NodeProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "NODE_NUMBER": str(node)}
        command = [self.python, "-m", "services.node"] if command is None else list(command)
        proc = self.launcher(command, env, REPO_ROOT, self.log_path(node))
        self.procs[node] = proc
        return proc

    @property
    def start_order(self) -> tuple[int, ...]:
        """The index nodes first (workers search them as soon as they serve), node 0 last."""
        cluster = self.settings.cluster
        return (*cluster.index_nodes, *sorted(cluster.workers, reverse=True))

    def start(self, timeout_s: float | None = None) -> "LocalCluster":
        for node in self.start_order:
            self.start_node(node)
        self.wait_healthy(timeout_s=timeout_s)
        self.wait_rotation(timeout_s=timeout_s)
        return self

    def wait_rotation(self, timeout_s: float | None = None) -> None:
        """Node 0's gateway has every worker it routes to in its rotation: a worker that became ready
        after node 0 did joins at the gateway's next probe (HEALTH_INTERVAL_S), not at once."""
        def all_up(body: dict) -> bool:
            workers = body.get("workers") or []
            return bool(workers) and all(worker.get("up") for worker in workers)

        try:
            wait_healthy(self.url(0), timeout_s or STARTUP_TIMEOUT_S, poll_s=0.1, request_timeout_s=2,
                         check=functools.partial(self._raise_if_exited, self.start_order), ready=all_up)
        except TimeoutError:
            raise TimeoutError(f"node 0's gateway did not see every worker ready in time; logs in {self.log_dir}") \
                from None

    def healthy(self, node: int) -> bool:
        return health(self.url(node), request_timeout_s=2) is not None

    def wait_healthy(self, nodes: Sequence[int] | None = None, timeout_s: float | None = None) -> None:
        """Every node in `nodes` (default: all) answers /health 200, within one shared deadline.

        RuntimeError (with the log's tail) as soon as a node still waited for has exited.
        """
        nodes = self.start_order if nodes is None else tuple(nodes)
        deadline = time.monotonic() + (timeout_s or STARTUP_TIMEOUT_S)
        for i, node in enumerate(nodes):
            pending = nodes[i:]
            try:
                wait_healthy(self.url(node), deadline - time.monotonic(), poll_s=0.2, request_timeout_s=2,
                             check=functools.partial(self._raise_if_exited, pending))
            except TimeoutError:
                raise TimeoutError(f"nodes {sorted(pending)} not healthy in time; logs in {self.log_dir}") from None

    def _raise_if_exited(self, nodes) -> None:
        for node in nodes:
            proc = self.procs.get(node)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"node {node} exited with {proc.returncode}; see {self.log_path(node)}:\n"
                                   + self.tail(node))

    def tail(self, node: int, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path(node).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill_node(self, node: int) -> None:
        """SIGKILL: a crash, as far as the others can tell."""
        proc = self.procs.pop(node, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    def stop_node(self, node: int, timeout_s: float | None = None) -> int | None:
        """SIGTERM (the node drains its in-flight work), SIGKILL only past its grace period."""
        timeout_s = self.settings.limits.shutdown_grace_s + STOP_MARGIN_S if timeout_s is None else timeout_s
        proc = self.procs.pop(node, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        return proc.returncode

    def stop(self, timeout_s: float | None = None) -> dict[int, int | None]:
        # Node 0 first (no new requests come in), the index nodes last (the workers still search them).
        order = reversed(self.start_order)
        return {node: self.stop_node(node, timeout_s) for node in order if node in self.procs}

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Supervisor:
    """Keeps a started cluster running: a node that exits is logged and restarted, at most
    `limit` times per node within `window_s`; past that (or after a config error, which a
    restart cannot cure) the node is given up on loudly and the others keep serving."""

    def __init__(self, cluster: LocalCluster, limit: int, window_s: float, clock=time.monotonic):
        self.cluster = cluster
        self.limit, self.window_s = limit, window_s
        self._clock = clock
        self.restarts: dict[int, deque[float]] = {}
        self.given_up: set[int] = set()

    def check(self) -> None:
        """One look at every node: restart (or give up on) those that exited."""
        for node, proc in list(self.cluster.procs.items()):
            if proc.poll() is None:
                continue
            log.error("node %d exited with %s; see %s:\n%s", node, proc.returncode, self.cluster.log_path(node),
                      self.cluster.tail(node, lines=10))
            why_not = self._why_not_restart(node, proc.returncode)
            if why_not:
                self.cluster.procs.pop(node)
                self.given_up.add(node)
                log.critical("giving up on node %d (%s); the other nodes keep serving", node, why_not)
                continue
            self.cluster.start_node(node)
            log.warning("restarted node %d (restart %d of %d allowed within %gs)", node,
                        len(self.restarts[node]), self.limit, self.window_s)

    def _why_not_restart(self, node: int, code: int | None) -> str:
        """'' when the node may be restarted now (and counts the restart), else why not."""
        if code == CONFIG_ERROR_EXIT:
            return "it exited with a configuration error"
        now = self._clock()
        recent = self.restarts.setdefault(node, deque())
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        if len(recent) >= self.limit:
            return f"{len(recent)} restarts within {self.window_s:g}s already (LOCAL_RESTART_LIMIT)"
        recent.append(now)
        return ""


def free_ports(n: int) -> list[int]:
    """n ports free on 127.0.0.1 right now (the OS picks them)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_topology(workers: int, shards: int, replicas: int) -> dict[str, str]:
    """The cluster settings of `workers` workers (node 0 among them) and `shards` index shards of
    `replicas` nodes each: workers 0 .. workers-1, then the index nodes; 2, 1, 1 is the default
    three-node cluster. A cluster has 3 nodes at least: one that would be short is an extra replica."""
    if workers < 1 or shards < 1 or replicas < 1:
        raise ValueError(f"workers, shards and replicas must be >= 1, got {workers}, {shards}, {replicas}")
    total = max(3, workers + shards * replicas)
    index_nodes = range(workers, total)
    return {"TOTAL_NODES": str(total), "INDEX_NODES": ",".join(map(str, index_nodes)), "INDEX_SHARDS": str(shards)}


def pinned_env(env: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """Resolve the model source once here, building the stand-ins first if that is what the nodes
    would read and they are missing (a node never builds them), and pin it for the children.
    `cores`: the machine's cores (default: what this process may use)."""
    from builders.standins import source_building_standins
    settings = Settings.from_env(env)
    source = source_building_standins(settings)
    pinned = {**env, "MODEL_SOURCE": source.kind}
    if source.is_standin:
        pinned["STANDIN_HOME"] = str(settings.standin_dir)
    # Thread budget: the workers share this machine's cores (on separate
    # machines each node has its own and 0 = all of them is right), and an index
    # node needs little: split the cores between the workers, one faiss thread. Unsplit, two
    # workers of two threads on two cores served a third as many requests (docs/performance.md, section 37).
    cores = thread_budget(0, cores)
    if settings.models.torch_threads == 0:
        pinned["TORCH_THREADS"] = str(max(1, cores // len(settings.cluster.workers)))
    if settings.index.faiss_threads == 0:
        pinned["FAISS_THREADS"] = "1"
    return pinned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the three nodes locally on 127.0.0.1 (configured by the "
                                     "same environment variables as a node: env.example)",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--log-dir", default=str(REPO_ROOT / "logs" / "local"), help="one log file per node here")
    parser.add_argument("--startup-timeout-s", type=float, default=STARTUP_TIMEOUT_S,
                        help="how long to wait for every node to answer /health 200")
    parser.add_argument("--restart-limit", type=int, default=RESTART_LIMIT,
                        help="restarts of one node that died allowed within --restart-window-s; beyond, that node is "
                             "given up on (loudly) and the others keep serving")
    parser.add_argument("--restart-window-s", type=float, default=RESTART_WINDOW_S,
                        help="the window --restart-limit counts restarts in")
    topology = parser.add_argument_group("topology (none given: the environment's TOTAL_NODES, INDEX_NODES, "
                                         "INDEX_SHARDS, as on separate machines)")
    for name, what in (("workers", "workers, node 0 among them"), ("index-shards", "index shards"),
                       ("index-replicas", "index nodes per shard")):
        variable = f"LOCAL_{name.upper().replace('-', '_')}"
        topology.add_argument(f"--{name}", type=int, default=os.environ.get(variable),
                              help=f"{what} (default: ${variable})")
    args = parser.parse_args(argv)
    for name in ("workers", "index_shards", "index_replicas"):
        value = getattr(args, name)
        if value is not None and int(value) < 1:
            parser.error(f"--{name.replace('_', '-')} must be 1 or more, got {value}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s local-cluster %(levelname)s: %(message)s")
    try:
        env = dict(os.environ)
        if args.workers or args.index_shards or args.index_replicas:
            env.update(local_topology(int(args.workers or 2), int(args.index_shards or 1),
                                      int(args.index_replicas or 1)))
        env = pinned_env(env)
        cluster = LocalCluster(env, Path(args.log_dir))
        cluster.settings.require_index_files()
        cluster.settings.require_documents()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()

    def on_signal(signum, _frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("starting nodes %s; logs in %s", ", ".join(map(str, cluster.start_order)), cluster.log_dir)
    try:
        cluster.start(timeout_s=args.startup_timeout_s)
        log.info("all %d nodes healthy; gateway at %s (Ctrl-C stops them)", len(cluster.start_order), cluster.url(0))
        print(f"READY {cluster.url(0)}", flush=True)
        supervisor = Supervisor(cluster, args.restart_limit, args.restart_window_s)
        while not stopping.wait(SUPERVISE_POLL_S):  # until Ctrl-C or SIGTERM: a node's death is not the end
            supervisor.check()
    except (RuntimeError, TimeoutError) as exc:
        log.error("%s", exc)
        return 1
    finally:
        codes = cluster.stop()
        if codes:
            log.info("stopped: %s", ", ".join(f"node {n} exit {c}" for n, c in codes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
