"""The worker's Prometheus family the autoscaler reads: the requests it holds now."""
from __future__ import annotations

from typing import Callable

from prometheus_client.core import GaugeMetricFamily

from services.roles.worker.request_path import Worker

# The HorizontalPodAutoscaler's metric (deploy/k8s/autoscaling.yaml, through the Prometheus adapter's rule).
CONCURRENCY_METRIC = "rag_worker_concurrency"


class WorkerCollector:
    """rag_worker_concurrency: requests in progress on this worker, queued for a stage or running in one."""

    def __init__(self, worker: Callable[[], Worker | None]):
        self._worker = worker

    def collect(self):
        worker = self._worker()
        if worker is not None:
            yield GaugeMetricFamily(CONCURRENCY_METRIC, "Requests this worker holds: queued for a stage or running "
                                    "in one (in flight + queue; what the autoscaler scales the workers on)",
                                    value=worker.holding)
