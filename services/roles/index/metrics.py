"""The index node's metrics beyond its batcher's: the recall@10 each served data version's build measured."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from pipeline.data_version import shard_recall


class RecallCollector:
    """rag_index_recall_at_10{version, shard}: this node's shard of every loaded version (read at scrape time)."""

    def __init__(self, data: Callable[[], Any], shard: int):
        self._data = data
        self._shard = shard

    def collect(self):
        gauge = GaugeMetricFamily("rag_index_recall_at_10",
                                  "recall@10 against an exact search, measured by the data build (builders.recall)",
                                  labels=["version", "shard"])
        data = self._data()
        for service in data.versions.values() if data is not None else ():
            manifest = service.manifest
            recall = shard_recall(manifest, self._shard) if manifest is not None else None
            if recall is not None:
                gauge.add_metric([manifest.version, str(self._shard)], recall)
        yield gauge
