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
from werkzeug.wsgi import ClosingIterator

from pipeline.config import ConfigError, Settings
from pipeline.device import thread_budget
from services.gateway import Gateway, NoWorkerAvailable, Target, WorkerFailed, remote_target
from services.http import ApiError, internal_endpoint, make_app, read_json_object, require_string, serve
from services.index_server import MAX_SEARCH_BODY_BYTES, IndexService, create_index_app
from services.lifecycle import Readiness
from services.cache import ResponseCache
from services.metrics import CacheCollector, GatewayCollector, NodeMetrics
from services.node_client import IndexClient, WorkerClient
from pipeline.stages import Stages
from services.worker import RequestTimeout, StageFailed, Worker

log = logging.getLogger("services.node")

ROLES = {0: "gateway+worker", 1: "worker", 2: "index"}
MAX_INTERNAL_TIMEOUT_S = 3600
# After the last request in flight returns, waitress may still be writing its
# reply to the socket from its own loop: wait this long before the process exits.
EXIT_LINGER_S = 0.5


def default_http_threads(settings: Settings, node: int) -> int:
    # A request in flight holds one waitress thread while it waits on its futures
    # (on node 0 the same thread waits on node 1 for a forwarded one). The gateway
    # admits at most GATEWAY_MAX_IN_FLIGHT, and on failover node 1 may get them all;
    # 32 more keep /health, /metrics, joins, cache hits and quick 503s answered.
    # Node 2 sees only batched searches: one call at a time per worker's search stage.
    return 32 if node == 2 else settings.gateway_max_in_flight + 32


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
        self.in_flight = 0  # HTTP requests between arrival and the end of their reply
        self.lock = threading.Lock()
        self.metrics = NodeMetrics(self.batching_services)
        self.metrics.register(GatewayCollector(lambda: self.gateway))
        self.response_cache = ResponseCache(settings.response_cache_size, settings.response_cache_ttl_s)
        self.metrics.register(CacheCollector(self.metered_caches))

    def caches(self):
        """What POST /cache/clear empties: answers that a change of models or documents makes stale."""
        if self.worker is not None:
            yield self.worker.embed_cache
        if self.node == 0:
            yield self.response_cache

    def metered_caches(self):
        yield from self.caches()
        # Replies kept by request_id are not cleared: a retried request must get the reply it got.
        if self.gateway is not None:
            yield self.gateway.completed

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
            body["gateway"] = self.gateway.stats()
        if self.readiness.detail:
            body["detail"] = self.readiness.detail
        return body

    def require_ready(self) -> None:
        if not self.readiness.ready:
            raise ApiError(503, f"node {self.node} is {self.readiness.state}", retry_after_s=5)


def _parse_query(settings: Settings) -> tuple[dict, str, str]:
    """The body of /query or /internal/answer, checked the same way on both."""
    body = read_json_object(settings.max_body_bytes)
    return (body, require_string(body, "request_id", settings.max_request_id_chars),
            require_string(body, "query", settings.max_query_chars))


def _internal_timeout(body: dict, settings: Settings) -> float:
    """The caller's time left (the gateway's deadline), never more than our own limit."""
    timeout_s = body.get("timeout_s", settings.request_timeout_s)
    if type(timeout_s) not in (int, float) or not 0 < timeout_s <= MAX_INTERNAL_TIMEOUT_S:
        raise ApiError(400, f"'timeout_s' must be a number of seconds over 0 and at most {MAX_INTERNAL_TIMEOUT_S}",
                       field="timeout_s")
    return min(float(timeout_s), settings.request_timeout_s)


def _track_in_flight(app: Flask, state: NodeState) -> None:
    """Count requests until their reply has been handed to waitress, for the SIGTERM drain.

    A WSGI wrapper rather than Flask hooks: teardown_request runs before the
    reply body is handed over, so a drain that trusted it could cut replies.
    """
    inner = app.wsgi_app

    def leave():
        with state.lock:
            state.in_flight -= 1

    def counted(environ, start_response):
        with state.lock:
            state.in_flight += 1
        try:
            return ClosingIterator(inner(environ, start_response), [leave])
        except BaseException:
            leave()
            raise

    app.wsgi_app = counted


def create_worker_app(state: NodeState) -> Flask:
    app = make_app(f"node-{state.node}")
    _track_in_flight(app, state)
    state.metrics.instrument(app)

    @app.get("/health")
    def health():
        return jsonify(state.health_body()), (200 if state.readiness.ready else 503)

    @app.post("/cache/clear")
    @internal_endpoint(state.settings.cluster_token)
    def cache_clear():
        cleared = {cache.name: cache.clear() for cache in state.caches()}
        log.info("caches cleared: %s", cleared)
        return jsonify({"cleared": cleared})

    @app.post("/internal/answer")
    @internal_endpoint(state.settings.cluster_token)
    def internal_answer():
        state.require_ready()
        body, request_id, query = _parse_query(state.settings)
        timeout_s = _internal_timeout(body, state.settings)
        try:
            reply = state.worker.answer(request_id, query, timeout_s)
        except RequestTimeout:
            log.warning("request_id=%r timed out after %.1fs", request_id, timeout_s)
            raise ApiError(504, "Request timeout") from None
        except StageFailed as exc:
            log.error("request_id=%r failed: %s", request_id, exc)
            raise ApiError(500, str(exc)) from None
        reply["served_by"] = state.node
        return jsonify(reply)

    if state.node == 0:
        @app.post("/query")
        def query():
            state.require_ready()
            _, request_id, text = _parse_query(state.settings)
            log.info("query request_id=%r", request_id)  # repr: an id cannot forge log lines
            started = time.monotonic()
            claim = state.response_cache.claim(request_id, text)
            if claim.reply is not None:
                return jsonify(claim.reply)
            if claim.leader is not None:  # the same question is being answered right now
                try:
                    reply = state.response_cache.joined_reply(claim.leader, request_id,
                                                              state.settings.request_timeout_s)
                except TimeoutError:
                    log.warning("request_id=%r timed out waiting for the same question in flight", request_id)
                    raise ApiError(504, "Request timeout") from None
                if reply is not None:
                    return jsonify(reply)
                # That computation failed; a failure is not shared: answer this one ourselves.
            timeout_s = state.settings.request_timeout_s - (time.monotonic() - started)
            try:
                reply = state.gateway.answer(request_id, text, timeout_s)
            except BaseException as exc:
                state.response_cache.abandon(claim.key, exc)
                if isinstance(exc, RequestTimeout):
                    log.warning("request_id=%r timed out", request_id)
                    raise ApiError(504, "Request timeout") from None
                if isinstance(exc, NoWorkerAvailable):
                    log.warning("request_id=%r: %s", request_id, exc)
                    raise ApiError(503, str(exc), retry_after_s=5) from None
                if isinstance(exc, WorkerFailed):
                    log.error("request_id=%r: %s", request_id, exc)
                    raise ApiError(500, exc.public) from None
                raise
            state.response_cache.finish(claim.key, reply)
            return jsonify(reply)

    return app


# ---------------------------------------------------------------------- startup

def _configure_threads(settings: Settings, node: int) -> None:
    if node != 2:  # the index server runs no model: importing torch would only cost memory and start time
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
                        read_timeout_s=settings.search_timeout_s, token=settings.cluster_token)
    state.worker = Worker(settings, stages, index)
    if state.node == 0:
        state.gateway = Gateway(_gateway_targets(state), health_interval_s=settings.health_interval_s,
                                max_in_flight=settings.gateway_max_in_flight,
                                completed_cache_size=settings.idempotency_cache_size,
                                completed_ttl_s=settings.idempotency_ttl_s)
    log.info("node %d loaded and warmed its models in %.1fs (%s)", state.node,
             time.monotonic() - started, state.model_source)


def _gateway_targets(state: NodeState) -> list[Target]:
    settings, worker = state.settings, state.worker
    targets = []
    for node in settings.worker_nodes:
        if node == state.node:  # our own worker: an in-process call, no HTTP hop
            # The gateway exists only once this worker is loaded; it serves until the node stops
            # (a stopping node refuses new requests before they reach the gateway).
            serving = (Readiness.STARTING, Readiness.READY, Readiness.STOPPING)
            targets.append(Target(node=node, answer=worker.answer, probe=lambda: state.readiness.state in serving,
                                  local=True))
        else:
            client = WorkerClient(settings.node_address(node).url, connect_timeout_s=settings.connect_timeout_s,
                                  token=settings.cluster_token)
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


def _install_shutdown(state: NodeState, grace_s: float) -> None:
    """SIGTERM/SIGINT: refuse new work (503), let in-flight requests finish within grace_s, exit 0."""
    def drain():
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with state.lock:
                if state.in_flight == 0:
                    break
            time.sleep(0.05)
        time.sleep(EXIT_LINGER_S)
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
    _configure_threads(settings, node)
    state = NodeState(settings, node)
    if node == 2:
        app = create_index_app(state.readiness, state.index_holder, node=node, settings=settings)
        _track_in_flight(app, state)
        state.metrics.instrument(app)
        load = lambda: _load_index(state, state.index_holder)  # noqa: E731
        max_body = MAX_SEARCH_BODY_BYTES
    else:
        app = create_worker_app(state)
        load = lambda: _load_worker(state)  # noqa: E731
        max_body = settings.max_body_bytes
    address = settings.node_address(node)  # our own address only: never 0.0.0.0
    threads = settings.waitress_threads or default_http_threads(settings, node)
    try:
        server = serve(app, address.host, address.port, threads, max_body_bytes=max_body)
    except OSError as exc:
        print(f"config error: NODE_{node}_IP={str(address)!r} cannot be bound: {exc.strerror}", file=sys.stderr)
        return 2
    _install_shutdown(state, settings.shutdown_grace_s)
    log.info("node %d (%s) listening on %s with %d HTTP threads", node, ROLES[node], address, threads)
    _start_loading(state, load)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
