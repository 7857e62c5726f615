"""A centroid shard's /search: the body's "lists" (each vector's IVF lists to probe, which a worker's
router picked: pipeline.centroid_routing) checked against the lists this shard owns. A hash shard
(doc_id % N) refuses "lists"; a centroid shard requires it, since its own nprobe nearest lists
would mostly be empty here and the answer would silently miss documents.
"""
from __future__ import annotations

from pipeline.centroid_routing import is_centroid
from pipeline.centroid_search import owned_lists
from pipeline.data_version import Manifest
from services.server.errors import ApiError


def parse_probe_lists(body: dict, rows: int, nlist: int, owned: frozenset[int] | None,
                      where: str) -> list[list[int]] | None:
    """Each vector's lists to probe, or None for a hash shard; ApiError(400) naming "lists" and the rule.
    `owned`: the lists this shard owns (None: a hash shard); `where`: this shard, for the messages."""
    lists = body.get("lists")
    if owned is None:
        if lists is not None:
            raise ApiError(400, f"'lists' is for centroid shards; {where} holds documents by doc_id % N: leave it out",
                           field="lists")
        return None
    if lists is None:
        raise ApiError(400, f"'lists' is required: {where} is a centroid shard, searched only over the IVF lists "
                            "a worker's router names", field="lists")
    if not isinstance(lists, list) or len(lists) != rows:
        raise ApiError(400, f"'lists' must hold one list of IVF list ids per embedding ({rows})", field="lists")
    parsed = []
    for i, row in enumerate(lists):
        if not isinstance(row, list) or not 1 <= len(row) <= nlist:
            raise ApiError(400, f"lists[{i}] must be a list of 1 to {nlist} IVF list ids", field="lists")
        for lst in row:
            if type(lst) is not int or not 0 <= lst < nlist:
                raise ApiError(400, f"lists[{i}] holds {lst!r}: IVF list ids are integers from 0 to {nlist - 1}",
                               field="lists")
            if lst not in owned:
                raise ApiError(400, f"lists[{i}] names list {lst}, which {where} does not own", field="lists")
        if len(set(row)) != len(row):
            raise ApiError(400, f"lists[{i}] names a list twice", field="lists")
        parsed.append(row)
    return parsed


def owned_lists_of(manifest: Manifest, shard: int) -> frozenset[int] | None:
    """The IVF lists `shard` owns in a centroid-sharded version; None in a hash-sharded one."""
    sharding = manifest.sharding
    return owned_lists(sharding["owners"], shard) if is_centroid(sharding) else None
