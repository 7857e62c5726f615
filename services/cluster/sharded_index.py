"""A worker's view of a sharded index: every shard searched at once (one IndexClient each, failing
over between its replicas), the top k merged by distance (pipeline.shards.merge_batch). A shard that
cannot answer fails the whole search: an answer never silently leaves out part of the index.

A centroid-sharded data version (pipeline.centroid_routing) is searched only on the shards owning each
query's nprobe nearest lists, each asked for its rows with their lists; its router (the coarse
quantizer, from the version's directory beside the documents) is loaded once per version.
"""
from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pipeline.centroid_routing import CentroidRouter, Route, is_centroid, merge_routed
from pipeline.config.sections import ClusterSettings
from pipeline.data_version import DataVersionError, data_root_of, load_version, serving_params, version_dir_of
from pipeline.shards import merge_batch
from services.cluster.clients import IndexClient
from services.cluster.discovery import Resolver
from services.cluster.membership import Member, Membership, shard_replicas


class ShardedIndexClient:
    """The search of `shards` (one IndexClient each, in shard order) as one index."""

    def __init__(self, shards: Sequence[IndexClient], memberships: Sequence[Membership] = (),
                 routers: Callable[[str | None], CentroidRouter | None] | None = None):
        if not shards:
            raise ValueError("an index needs at least one shard")
        self.shards = list(shards)
        self.routers = routers  # a data version's centroid router, None for a hash-sharded one
        self.memberships = list(memberships)  # the shards' replicas (closed with us)
        # One thread per shard beyond the caller's own: the search stage runs one batch at a time.
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.shards) - 1), thread_name_prefix="shard")

    @classmethod
    def from_cluster(cls, cluster: ClusterSettings, *, read_timeout_s: float, resolver: Resolver | None = None,
                     routers: Callable[[str | None], CentroidRouter | None] | None = None) -> ShardedIndexClient:
        """One client per shard over its replicas: each shard's membership (INDEX_NODES' addresses, or
        whoever INDEX_DISCOVERY's name for it lists), kept current."""
        count = cluster.index_shards
        shards = [IndexClient([], connect_timeout_s=cluster.connect_timeout_s, read_timeout_s=read_timeout_s,
                              token=cluster.cluster_token, allow_none=True,
                              name="index server" if count == 1 else f"index shard {shard} of {count}")
                  for shard in range(count)]
        memberships = [membership.subscribe(_replicas_of(shard)).start()
                       for membership, shard in zip(shard_replicas(cluster, resolver), shards)]
        return cls(shards, memberships, routers)

    def search(self, vectors: np.ndarray, k: int, deadline: float | None = None, request_ids: Sequence[str] = (),
               trace_parents: Sequence = (), version: str | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """Each query's top k over every shard: (ids, distances), as IndexClient.search; `version`: the
        data version every shard searches (None: each node's current one)."""
        def on(shard: IndexClient) -> tuple[list[list[int]], list[list[float]]]:
            return shard.search(vectors, k, deadline=deadline, request_ids=request_ids, trace_parents=trace_parents,
                                version=version)

        router = self.routers(version) if self.routers is not None else None
        if router is not None:
            if router.shards != len(self.shards):
                raise DataVersionError(f"data version {version!r} is in {router.shards} centroid shards, but "
                                       f"INDEX_SHARDS={len(self.shards)}")
            return self._search_routed(router, vectors, k, lambda route: self.shards[route.shard].search(
                vectors[route.rows], k, deadline=deadline, request_ids=request_ids, trace_parents=trace_parents,
                version=version, lists=route.lists))
        if len(self.shards) == 1:
            return on(self.shards[0])
        # The other shards on the pool, in the caller's context (its trace); the first on this thread.
        futures = [self._pool.submit(contextvars.copy_context().run, on, shard) for shard in self.shards[1:]]
        answers = [on(self.shards[0])]
        answers += [future.result() for future in futures]  # each bounded by the deadline; the first error wins
        merged = merge_batch([list(zip(ids, distances)) for ids, distances in answers], k)
        return [ids for ids, _ in merged], [distances for _, distances in merged]

    def _search_routed(self, router: CentroidRouter, vectors: np.ndarray, k: int,
                       on: Callable[[Route], tuple[list, list]]) -> tuple[list[list[int]], list[list[float]]]:
        """Only the shards the batch's lists fall in, each with its rows; the first on this thread."""
        routes = router.route(np.asarray(vectors, dtype=np.float32))
        futures = [self._pool.submit(contextvars.copy_context().run, on, route) for route in routes[1:]]
        answers = [on(routes[0])] if routes else []
        answers += [future.result() for future in futures]  # each bounded by the deadline; the first error wins
        return merge_routed(len(vectors), [(route.rows, ids, distances)
                                           for route, (ids, distances) in zip(routes, answers)], k)

    def close(self) -> None:
        for membership in self.memberships:
            membership.close()
        self._pool.shutdown(wait=False)
        for shard in self.shards:
            shard.close()


def _replicas_of(shard: IndexClient) -> Callable[[list[Member]], None]:
    """What a shard's membership calls with its replicas' addresses."""
    return lambda members: shard.set_replicas([member.url for member in members])


class CentroidRouters:
    """Each data version's centroid router, from its manifest and quantizer file in the version directory
    beside `documents_dir` (None for a hash-sharded version), loaded once and kept for the last few."""

    def __init__(self, documents_dir: Path, index_name: str, nprobe: int | None, keep: int = 4):
        self.documents_dir, self.index_name, self.nprobe, self.keep = Path(documents_dir), index_name, nprobe, keep
        self._routers: dict[str, CentroidRouter | None] = {}
        self._lock = threading.Lock()

    def __call__(self, version: str | None) -> CentroidRouter | None:
        # None: the version the configured path goes through now (its link's target).
        directory = version_dir_of(self.documents_dir) if version is None else data_root_of(self.documents_dir) / version
        name = directory.resolve().name
        with self._lock:
            if name in self._routers:
                return self._routers[name]
        manifest = load_version(directory)
        router = None
        if is_centroid(manifest.sharding):
            # The nprobe the index nodes serve: the setting where set, else what the build measured recall at.
            nprobe, _ = serving_params(manifest, self.nprobe, None)
            if nprobe is None:
                raise DataVersionError(f"data version {name!r} is in centroid shards, but its manifest records no "
                                       "nprobe and NPROBE is not set: set NPROBE")
            try:
                router = CentroidRouter.load(directory, self.index_name, manifest.sharding, nprobe)
            except (OSError, RuntimeError, KeyError, ValueError) as exc:
                raise DataVersionError(f"data version {name!r} is in centroid shards, but its router cannot be "
                                       f"loaded from {directory}: {exc}") from exc
        with self._lock:
            self._routers[name] = router
            while len(self._routers) > self.keep:
                self._routers.pop(next(iter(self._routers)))
        return router
