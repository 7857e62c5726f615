"""Prometheus metrics for every node: HTTP requests, batching services, process.

The batching services keep plain counters (no prometheus import in the heart
of the design); a collector turns their snapshots into metric families at
scrape time, so a scrape costs nothing between scrapes.
"""
from __future__ import annotations

import resource
import time
from typing import Callable, Iterable

from flask import Flask, Response, g, request
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from services.batching import BatchingService

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class BatchingCollector:
    """Yields the metric families of the batching services a callable returns."""

    def __init__(self, services: Callable[[], Iterable[BatchingService]]):
        self._services = services

    def collect(self):
        size = HistogramMetricFamily("rag_batch_size", "Items per batch run by a stage", labels=["stage"])
        batches = CounterMetricFamily("rag_batches", "Batches run by a stage", labels=["stage"])
        items = CounterMetricFamily("rag_batch_items", "Items run by a stage", labels=["stage"])
        failed = CounterMetricFamily("rag_batch_failed_items", "Items that got an exception", labels=["stage"])
        cancelled = CounterMetricFamily("rag_batch_cancelled_items", "Items cancelled before running",
                                        labels=["stage"])
        waited = CounterMetricFamily("rag_batch_wait_seconds", "Sum of item waits from submit to batch start",
                                     labels=["stage"])
        ran = CounterMetricFamily("rag_batch_run_seconds", "Sum of batch function run times", labels=["stage"])
        depth = GaugeMetricFamily("rag_batch_queue_depth", "Items waiting for a batch", labels=["stage"])
        for service in self._services():
            st = service.stats()
            label = [st.name]
            cumulative, buckets = 0, []
            for bound in BATCH_BUCKETS:
                cumulative = sum(c for s, c in st.batch_size_counts.items() if s <= bound)
                buckets.append((str(float(bound)), cumulative))
            buckets.append(("+Inf", st.batches_total))
            # Sum of batch sizes (for continuous generation a "batch" is one decode
            # step, whose size is its rows, not the requests that finished).
            size.add_metric(label, buckets, sum_value=float(sum(s * c for s, c in st.batch_size_counts.items())))
            batches.add_metric(label, st.batches_total)
            items.add_metric(label, st.items_total)
            failed.add_metric(label, st.failed_items_total)
            cancelled.add_metric(label, st.cancelled_items_total)
            waited.add_metric(label, st.wait_seconds_sum)
            ran.add_metric(label, st.run_seconds_sum)
            depth.add_metric(label, st.queue_depth)
        yield from (size, batches, items, failed, cancelled, waited, ran, depth)


class PeakRssCollector:
    def collect(self):
        # ru_maxrss is in KiB on Linux.
        peak = GaugeMetricFamily("rag_process_peak_rss_bytes", "Peak resident set size of this process")
        peak.add_metric([], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        yield peak


class GatewayCollector:
    """Requests the gateway sent to each worker, and whether each is in the rotation."""

    def __init__(self, gateway: Callable[[], object]):
        self._gateway = gateway

    def collect(self):
        gateway = self._gateway()
        if gateway is None:
            return
        forwarded = CounterMetricFamily("rag_gateway_forwarded", "Requests answered by each worker",
                                        labels=["worker"])
        up = GaugeMetricFamily("rag_gateway_worker_up", "1 if the worker is in the rotation", labels=["worker"])
        for status in gateway.status():
            forwarded.add_metric([str(status["node"])], status["forwarded"])
            up.add_metric([str(status["node"])], 1 if status["up"] else 0)
        yield forwarded
        yield up


class CacheCollector:
    """Hits, misses, evictions and size of the node's caches."""

    def __init__(self, caches: Callable[[], Iterable[object]]):
        self._caches = caches

    def collect(self):
        hits = CounterMetricFamily("rag_cache_hits", "Cache lookups that found an entry", labels=["cache"])
        misses = CounterMetricFamily("rag_cache_misses", "Cache lookups that found nothing", labels=["cache"])
        evictions = CounterMetricFamily("rag_cache_evictions", "Entries pushed out by newer ones", labels=["cache"])
        joined = CounterMetricFamily("rag_cache_joined", "Misses that joined the same computation in flight",
                                     labels=["cache"])
        entries = GaugeMetricFamily("rag_cache_entries", "Entries held", labels=["cache"])
        for cache in self._caches():
            st = cache.stats()
            hits.add_metric([st.name], st.hits)
            misses.add_metric([st.name], st.misses)
            evictions.add_metric([st.name], st.evictions)
            joined.add_metric([st.name], st.joined)
            entries.add_metric([st.name], st.entries)
        yield from (hits, misses, evictions, joined, entries)


class NodeMetrics:
    """One registry per node process, plus the Flask hooks that feed it."""

    def __init__(self, services: Callable[[], Iterable[BatchingService]] = lambda: ()):
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(PeakRssCollector())
        self.registry.register(BatchingCollector(services))
        self.requests = Counter("rag_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("rag_http_request_duration_seconds", "HTTP request latency by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)

    def register(self, collector) -> None:
        self.registry.register(collector)

    def instrument(self, app: Flask) -> None:
        @app.before_request
        def _start():
            g._metrics_started = time.perf_counter()

        @app.after_request
        def _observe(response):
            endpoint = request.url_rule.rule if request.url_rule is not None else "unmatched"
            if endpoint != "/metrics":
                self.requests.labels(endpoint, str(response.status_code)).inc()
                started = g.get("_metrics_started")
                if started is not None:
                    self.latency.labels(endpoint).observe(time.perf_counter() - started)
            return response

        @app.get("/metrics")
        def metrics():
            return Response(generate_latest(self.registry), mimetype=CONTENT_TYPE.split(";")[0],
                            headers={"Content-Type": CONTENT_TYPE})
