"""Start one node's role from the environment: `NODE_NUMBER=N python -m services.node`.

Node 0: gateway + worker; node 1: worker; node 2: index server. The HTTP
server starts first and answers /health 503 "starting" while models or the
index load in the background, so deployers can watch a node come up.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from flask import Flask, jsonify

from pipeline.config import ConfigError, Settings
from pipeline.device import thread_budget
from services.gateway import Gateway, NoWorkerAvailable, Target, remote_target
from services.http import ApiError, make_app, read_json_object, require_string, serve
from services.index_server import IndexService, create_index_app
from services.lifecycle import Readiness
from services.metrics import GatewayCollector, NodeMetrics
from services.node_client import IndexClient, NodeError, WorkerClient
from services.worker import RequestTimeout, Stages, Worker

log = logging.getLogger("services.node")

MAX_REQUEST_ID_CHARS = 256
MAX_QUERY_CHARS = 4096
ROLES = {0: "gateway+worker", 1: "worker", 2: "index"}


def default_http_threads(node: int) -> int:
    # Each request in flight holds one waitress thread while it waits on its
    # futures; node 0 also holds one per request it forwards to node 1.
    return {0: 128, 1: 64, 2: 32}[node]


class NodeState:
    """What a node's handlers need; filled in by the startup thread."""

    def __init__(self, settings: Settings, node: int):
        self.settings = settings
        self.node = node
        self.readiness = Readiness()
        self.worker: Worker | None = None
        self.gateway: Gateway | None = None
        self.model_source = "loading"
        self.index_holder: dict[str, Any] = {}
        self.in_flight = 0
        self.lock = threading.Lock()
        self.metrics = NodeMetrics(self.batching_services)
        self.metrics.register(GatewayCollector(lambda: self.gateway))

    def batching_services(self):
        if self.worker is not None:
            yield from self.worker.services.values()
        if self.index_holder.get("service") is not None:
            yield self.index_holder["service"].batcher

    def health_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": "healthy" if self.readiness.ready else self.readiness.state,
                                "node": self.node, "total_nodes": self.settings.total_nodes,
                                "role": ROLES[self.node], "model_source": self.model_source}
        if self.worker is not None:
            body["device"] = self.worker.stages.devices()
            body["served"] = self.worker.served
            body["stages"] = {name: {"batches": st.batches_total, "items": st.items_total,
                                     "max_batch": st.max_batch_size_seen, "queue_depth": st.queue_depth}
                              for name, st in self.worker.stats().items()}
        if self.gateway is not None:
            body["workers"] = self.gateway.status()
        if self.readiness.detail:
            body["detail"] = self.readiness.detail
        return body

    def require_ready(self) -> None:
        if not self.readiness.ready:
            raise ApiError(503, f"node {self.node} is {self.readiness.state}", retry_after_s=5)


def _parse_query(body: dict) -> tuple[str, str]:
    return (require_string(body, "request_id", MAX_REQUEST_ID_CHARS),
            require_string(body, "query", MAX_QUERY_CHARS))


def _track_in_flight(app: Flask, state: NodeState) -> None:
    @app.before_request
    def _enter():
        with state.lock:
            state.in_flight += 1

    @app.teardown_request
    def _leave(_exc):
        with state.lock:
            state.in_flight -= 1


def create_worker_app(state: NodeState) -> Flask:
    app = make_app(f"node-{state.node}")
    _track_in_flight(app, state)
    state.metrics.instrument(app)

    @app.get("/health")
    def health():
        return jsonify(state.health_body()), (200 if state.readiness.ready else 503)

    @app.post("/internal/answer")
    def internal_answer():
        state.require_ready()
        body = read_json_object()
        request_id, query = _parse_query(body)
        timeout_s = body.get("timeout_s", state.settings.request_timeout_s)
        if type(timeout_s) not in (int, float) or not 0 < timeout_s <= 3600:
            raise ApiError(400, "'timeout_s' must be a number of seconds from 0 to 3600", field="timeout_s")
        try:
            reply = state.worker.answer(request_id, query, float(timeout_s))
        except RequestTimeout:
            raise ApiError(504, "Request timeout") from None
        reply["served_by"] = state.node
        return jsonify(reply)

    if state.node == 0:
        @app.post("/query")
        def query():
            state.require_ready()
            request_id, text = _parse_query(read_json_object())
            log.info("query request_id=%s", request_id)
            try:
                reply = state.gateway.answer(request_id, text, state.settings.request_timeout_s)
            except RequestTimeout:
                raise ApiError(504, "Request timeout") from None
            except NoWorkerAvailable as exc:
                raise ApiError(503, str(exc), retry_after_s=5) from None
            except NodeError as exc:
                raise ApiError(500, f"worker failed: {exc.message}") from None
            return jsonify(reply)

    return app


# ---------------------------------------------------------------------- startup

def _configure_threads(settings: Settings) -> None:
    import torch
    torch.set_num_threads(thread_budget(settings.torch_threads))
    try:
        import faiss
        faiss.omp_set_num_threads(thread_budget(settings.faiss_threads))
    except ImportError:
        pass


def _load_worker(state: NodeState) -> None:
    from pipeline.models import resolve_model_source
    settings = state.settings
    source = resolve_model_source(settings)
    state.model_source = source.describe()
    started = time.monotonic()
    stages = Stages.load(settings, source)
    stages.warm_up()
    index = IndexClient(settings.node_2_ip.url, connect_timeout_s=settings.connect_timeout_s,
                        read_timeout_s=settings.search_timeout_s)
    state.worker = Worker(settings, stages, index)
    if state.node == 0:
        state.gateway = Gateway(_gateway_targets(state), health_interval_s=settings.health_interval_s)
    log.info("node %d loaded and warmed its models in %.1fs (%s)", state.node,
             time.monotonic() - started, state.model_source)


def _gateway_targets(state: NodeState) -> list[Target]:
    settings, worker = state.settings, state.worker
    targets = []
    for node in settings.worker_nodes:
        if node == state.node:  # our own worker: an in-process call, no HTTP hop
            targets.append(Target(node=node, answer=worker.answer, probe=lambda: state.readiness.ready,
                                  local=True))
        else:
            client = WorkerClient(settings.node_address(node).url, connect_timeout_s=settings.connect_timeout_s)
            targets.append(remote_target(node, client))
    return targets


def _load_index(state: NodeState, holder: dict) -> None:
    from pipeline.vector_index import VectorIndex
    settings = state.settings
    started = time.monotonic()
    index = VectorIndex.load(settings.faiss_index_path, nprobe=settings.nprobe, mmap=settings.faiss_mmap)
    cfg = settings.batching("index")
    holder["service"] = IndexService(index, max_size=cfg.max_size, max_wait_ms=cfg.max_wait_ms,
                                     max_queue=cfg.max_queue)
    state.model_source = "none"
    log.info("index %s loaded in %.2fs: %d vectors, dim %d, nprobe %s, mmap %s", settings.faiss_index_path,
             time.monotonic() - started, index.ntotal, index.dim, index.nprobe, index.is_mmap)


def _start_loading(state: NodeState, load) -> None:
    def run():
        try:
            load()
        except Exception as exc:
            state.readiness.set(Readiness.FAILED, f"{type(exc).__name__}: {exc}")
            log.exception("node %d failed to start", state.node)
            os._exit(1)
        state.readiness.set(Readiness.READY)
        log.info("node %d is ready", state.node)
    threading.Thread(target=run, name="startup", daemon=True).start()


def _install_shutdown(state: NodeState, server, drain_s: float) -> None:
    """SIGTERM/SIGINT: refuse new work (503), let in-flight requests finish, exit 0."""
    def drain():
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            with state.lock:
                if state.in_flight == 0:
                    break
            time.sleep(0.05)
        log.info("node %d stopped (in flight at exit: %d)", state.node, state.in_flight)
        logging.shutdown()
        os._exit(0)

    def on_signal(signum, _frame):
        if state.readiness.state == Readiness.STOPPING:
            return
        log.info("node %d got signal %d: draining", state.node, signum)
        state.readiness.set(Readiness.STOPPING)
        if state.gateway is not None:
            state.gateway.close()
        threading.Thread(target=drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def main() -> int:
    try:
        settings = Settings.from_env()
        node = settings.require_node_number()
        if node == 2:
            settings.require_index_file()
        else:
            settings.require_documents()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s node{node} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" chatter under load
    _configure_threads(settings)
    state = NodeState(settings, node)
    if node == 2:
        app = create_index_app(state.readiness, state.index_holder, node=node, total_nodes=settings.total_nodes,
                               timeout_s=settings.search_timeout_s)
        _track_in_flight(app, state)
        state.metrics.instrument(app)
        load = lambda: _load_index(state, state.index_holder)  # noqa: E731
    else:
        app = create_worker_app(state)
        load = lambda: _load_worker(state)  # noqa: E731
    address = settings.node_address(node)
    threads = settings.waitress_threads or default_http_threads(node)
    try:
        server = serve(app, address.host, address.port, threads)
    except OSError as exc:
        print(f"config error: NODE_{node}_IP={str(address)!r} cannot be bound: {exc.strerror}", file=sys.stderr)
        return 2
    _install_shutdown(state, server, drain_s=settings.request_timeout_s)
    log.info("node %d (%s) listening on %s with %d HTTP threads", node, ROLES[node], address, threads)
    _start_loading(state, load)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
