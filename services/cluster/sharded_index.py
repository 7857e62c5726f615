"""A worker's view of a sharded index: every shard searched at once (one IndexClient each, failing
over between its replicas), the top k merged by distance (pipeline.shards.merge_batch). A shard that
cannot answer fails the whole search: an answer never silently leaves out part of the index.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.config.parsers import Address
from pipeline.config.sections import ClusterSettings
from pipeline.shards import merge_batch
from services.cluster.clients import IndexClient
from services.cluster.discovery import Membership, Resolver, resolver_for


class ShardedIndexClient:
    """The search of `shards` (one IndexClient each, in shard order) as one index."""

    def __init__(self, shards: Sequence[IndexClient], memberships: Sequence[Membership] = ()):
        if not shards:
            raise ValueError("an index needs at least one shard")
        self.shards = list(shards)
        self.memberships = list(memberships)  # the shards' replicas, when discovered (closed with us)
        # One thread per shard beyond the caller's own: the search stage runs one batch at a time.
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.shards) - 1), thread_name_prefix="shard")

    @classmethod
    def from_cluster(cls, cluster: ClusterSettings, *, read_timeout_s: float,
                     resolver: Resolver | None = None) -> ShardedIndexClient:
        """One client per shard over its replicas, as the cluster section places them: INDEX_NODES'
        addresses, or (INDEX_DISCOVERY) whoever each shard's name lists, kept current."""
        count, discovered = cluster.index_shards, bool(cluster.index_discovery)
        shards = [IndexClient([] if discovered else [cluster.node_address(n).url for n in cluster.replicas(shard)],
                              connect_timeout_s=cluster.connect_timeout_s, read_timeout_s=read_timeout_s,
                              token=cluster.cluster_token, allow_none=discovered,
                              name="index server" if count == 1 else f"index shard {shard} of {count}")
                  for shard in range(count)]
        resolver = resolver or resolver_for(cluster)
        memberships = [Membership(name, resolver, cluster.discovery_interval_s, _replicas_of(shard)).start()
                       for name, shard in zip(cluster.index_discovery, shards)]
        return cls(shards, memberships)

    def search(self, vectors: np.ndarray, k: int, deadline: float | None = None, request_ids: Sequence[str] = (),
               trace_parents: Sequence = (), version: str | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """Each query's top k over every shard: (ids, distances), as IndexClient.search; `version`: the
        data version every shard searches (None: each node's current one)."""
        def on(shard: IndexClient) -> tuple[list[list[int]], list[list[float]]]:
            return shard.search(vectors, k, deadline=deadline, request_ids=request_ids, trace_parents=trace_parents,
                                version=version)

        if len(self.shards) == 1:
            return on(self.shards[0])
        # The other shards on the pool, in the caller's context (its trace); the first on this thread.
        futures = [self._pool.submit(contextvars.copy_context().run, on, shard) for shard in self.shards[1:]]
        answers = [on(self.shards[0])]
        answers += [future.result() for future in futures]  # each bounded by the deadline; the first error wins
        merged = merge_batch([list(zip(ids, distances)) for ids, distances in answers], k)
        return [ids for ids, _ in merged], [distances for _, distances in merged]

    def close(self) -> None:
        for membership in self.memberships:
            membership.close()
        self._pool.shutdown(wait=False)
        for shard in self.shards:
            shard.close()


def _replicas_of(shard: IndexClient) -> Callable[[list[Address]], None]:
    """What a shard's membership calls with its replicas' addresses."""
    return lambda members: shard.set_replicas([member.url for member in members])
