"""An index node's role: load its shard of the FAISS index, serve /search (ids back, never documents)."""
from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, jsonify

from pipeline.config import Settings
from pipeline.spec import Stage
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.index.search import MAX_SEARCH_BODY_BYTES, IndexService, max_search_values, parse_search_body
from services.roles.loaded import Loaded
from services.server.body import read_json_object
from services.server.token import internal_endpoint

log = logging.getLogger(__name__)


class IndexRole(Role):
    name = "index"
    uses_torch = False  # faiss only
    request_endpoints = ("/search",)  # one line per batch; its X-Request-ID names the batch's requests

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.service: Loaded[IndexService] = Loaded(f"node {self.node} is still loading its index")

    @staticmethod
    def check_settings(settings: Settings) -> None:
        settings.require_index_file(settings.require_node_number())

    @property
    def max_body_bytes(self) -> int:
        return MAX_SEARCH_BODY_BYTES

    def default_http_threads(self) -> int:
        # Node 2 sees only batched searches: one call at a time per worker's search stage.
        return SPARE_HTTP_THREADS

    def load(self) -> None:
        from pipeline.vector_index import VectorIndex
        settings = self.settings
        started = time.monotonic()
        path = settings.require_index_file(self.node)
        index = VectorIndex.load(path, nprobe=settings.index.nprobe, mmap=settings.index.faiss_mmap)
        cfg = settings.batching(Stage.INDEX)
        self.service.set(IndexService(index, max_size=cfg.max_batch, max_wait_ms=cfg.max_wait_ms,
                                    max_queue=cfg.max_queue))
        log.info("index %s loaded in %.2fs: %d vectors, dim %d, nprobe %s, mmap %s", path,
                 time.monotonic() - started, index.ntotal, index.dim, index.nprobe, index.is_mmap)

    def batching_services(self):
        service = self.service.value
        return (service.batcher,) if service is not None else ()

    def health_fields(self) -> dict[str, Any]:
        service = self.service.value
        if not self.lifecycle.ready or service is None:
            return {"detail": self.lifecycle.readiness.detail}
        index, cluster = service.index, self.settings.cluster
        return {"ntotal": index.ntotal, "dim": index.dim, "nprobe": index.nprobe, "mmap": index.is_mmap,
                "shard": cluster.served_shard(self.node), "shards": cluster.index_shards}

    def register_routes(self, app: Flask) -> None:
        timeout_s = self.settings.search.timeout_s

        @app.post("/search")
        @internal_endpoint(self.settings.cluster.cluster_token)
        def search():
            self.lifecycle.require_ready("index server")
            service = self.service.require()
            dim = service.index.dim
            body = read_json_object(MAX_SEARCH_BODY_BYTES, max_values=max_search_values(dim))
            vectors, k = parse_search_body(body, dim, service.max_queue)
            ids, distances = service.search(vectors, k, timeout_s)
            return jsonify({"ids": ids, "distances": distances})
