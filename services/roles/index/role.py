"""An index node's role: load its shard of the FAISS index, serve /search (ids back, never documents).

It holds its shard of every data version a rollout has it load (services.roles.versioned_data): a
search names the version its request reads (the current one if it names none) and the answer says
which version answered."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flask import Flask, jsonify

from pipeline.centroid_routing import is_centroid
from pipeline.config import Settings
from pipeline.data_version import DataVersionError, Manifest, overall_recall, serving_params, shard_recall
from pipeline.device import thread_budget
from pipeline.shards import shard_path
from pipeline.spec import Stage
from services.roles.base import SPARE_HTTP_THREADS, Role
from services.roles.data_routes import register_data_routes
from services.roles.index.probe_lists import owned_lists_of, parse_probe_lists
from services.roles.index.search import (
    MAX_SEARCH_BODY_BYTES,
    IndexService,
    max_search_values,
    parse_search_body,
    parse_search_version,
)
from services.roles.loaded import Loaded
from services.roles.versioned_data import VersionedData
from services.server.body import read_json_object
from services.server.token import internal_endpoint
from services.stages.upstream import Upstream

log = logging.getLogger(__name__)


class IndexRole(Role):
    name = "index"
    uses_torch = False  # faiss only
    request_endpoints = ("/search",)  # one line per batch; its X-Request-ID names the batch's requests

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.data: Loaded[VersionedData[IndexService]] = Loaded(f"node {self.node} is still loading its index")
        # The /search calls received and not yet queued: a batch none of them may join closes at once.
        self.upstream = Upstream()

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
        data = VersionedData(self.settings.index.faiss_index_path, self._open_version,
                             lambda service: service.close(5.0))
        data.load_startup()
        self.data.set(data)

    def _open_version(self, directory: Path, manifest: Manifest) -> IndexService:
        """This node's shard of one version, behind its own batching service."""
        from pipeline.vector_index import VectorIndex
        settings, cluster = self.settings, self.settings.cluster
        if manifest.shards != cluster.index_shards:
            raise DataVersionError(f"data version {manifest.version!r} in {directory} has {manifest.shards} shards, "
                                   f"but INDEX_SHARDS={cluster.index_shards}")
        started = time.monotonic()
        name = settings.index.faiss_index_path.name
        path = shard_path(directory / name, cluster.served_shard(self.node), cluster.index_shards)
        # Unset: the serving parameters the build measured (or tuned) its recall at, from the manifest.
        nprobe, ef_search = serving_params(manifest, settings.index.nprobe, settings.index.ef_search)
        index = VectorIndex.load(path, nprobe=nprobe, mmap=settings.index.faiss_mmap, ef_search=ef_search)
        cfg = settings.batching(Stage.INDEX)
        log.info("index %s (data version %s) loaded in %.2fs: %d vectors, dim %d, nprobe %s, ef_search %s, mmap %s, "
                 "recall@10 %s", path, manifest.version, time.monotonic() - started, index.ntotal, index.dim,
                 index.nprobe, index.ef_search, index.is_mmap, shard_recall(manifest, cluster.served_shard(self.node)))
        return IndexService(index, max_size=cfg.max_batch, max_wait_ms=cfg.max_wait_ms, max_queue=cfg.max_queue,
                            threads=thread_budget(settings.index.faiss_threads), manifest=manifest,
                            owned_lists=owned_lists_of(manifest, cluster.served_shard(self.node)),
                            upstream=self.upstream)

    def batching_services(self):
        data = self.data.value
        return tuple(service.batcher for service in data.versions.values()) if data is not None else ()

    def health_fields(self) -> dict[str, Any]:
        data = self.data.value
        if not self.lifecycle.ready or data is None:
            return {"detail": self.lifecycle.readiness.detail}
        cluster = self.settings.cluster
        fields: dict[str, Any] = {"shard": cluster.served_shard(self.node), "shards": cluster.index_shards,
                                  "data_version": data.current, "data_versions": data.status()["loaded"]}
        try:
            with data.versions.use() as lease:
                index, manifest = lease.value.index, lease.value.manifest
                fields.update(ntotal=index.ntotal, dim=index.dim, nprobe=index.nprobe, ef_search=index.ef_search,
                              mmap=index.is_mmap)
                if manifest is not None:
                    # hash: every query asks every shard; centroid: only the shards owning its nearest lists
                    fields.update(sharding="centroid" if is_centroid(manifest.sharding) else "hash",
                                  index_kind=manifest.index.get("spec", manifest.index.get("type")),
                                  recall_at_10=shard_recall(manifest, fields["shard"]),
                                  recall_at_10_overall=overall_recall(manifest),
                                  recall_params=(manifest.index.get("recall") or {}).get("params"))
        except Exception:  # noqa: BLE001 - released between the two looks: the next /health has it
            pass
        return fields

    def collectors(self):
        from services.roles.index.metrics import RecallCollector
        return (*super().collectors(), RecallCollector(lambda: self.data.value, self.settings.cluster.served_shard(self.node)))

    def register_routes(self, app: Flask) -> None:
        timeout_s, cluster = self.settings.search.timeout_s, self.settings.cluster

        @app.post("/search")
        @internal_endpoint(self.settings.cluster.cluster_token)
        def search():
            # Counted from here (every version's batch may wait for it) until queued, refused or failed.
            with self.upstream.begin((Stage.INDEX,)) as route:
                self.lifecycle.require_ready("index server")
                data = self.data.require()
                with data.versions.use() as current:  # the body's limits: every version has the one dimension
                    dim, max_queue = current.value.index.dim, current.value.max_queue
                body = read_json_object(MAX_SEARCH_BODY_BYTES, max_values=max_search_values(dim))
                version = parse_search_version(body)
                vectors, k = parse_search_body(body, dim, max_queue)
                # A version not held but complete on disk is loaded: a node restarted during a rollout catches up.
                lease = data.acquire(version, load_missing=True)
                try:
                    where = f"index shard {cluster.served_shard(self.node)} of {cluster.index_shards}"
                    lists = parse_probe_lists(body, len(vectors), lease.value.index.nlist or 0,
                                              lease.value.owned_lists, where)
                    ids, distances = lease.value.search(vectors, k, timeout_s, lists, route)
                finally:
                    lease.release()
            return jsonify({"ids": ids, "distances": distances, "version": lease.version})

        register_data_routes(app, self.data, self.lifecycle, self.settings.cluster.cluster_token)
