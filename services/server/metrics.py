"""Prometheus metrics every node has: the registry and /metrics, HTTP requests, the process, its
caches and what it runs; a role registers its own collectors beside these."""
from __future__ import annotations

import resource
import time
from typing import Any, Callable, Iterable, Protocol

from flask import Flask, Response, g, request
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.server.stream_response import STREAMED

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PeakRssCollector:
    def collect(self):
        # ru_maxrss is in KiB on Linux.
        peak = GaugeMetricFamily("rag_process_peak_rss_bytes", "Peak resident set size of this process")
        peak.add_metric([], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        yield peak


class CpuTimeCollector:
    """The process's CPU seconds from its own clock (CLOCK_PROCESS_CPUTIME_ID, nanoseconds): the standard
    process_cpu_seconds_total counts the kernel's 10 ms ticks, too coarse for a few requests' cost."""

    def collect(self):
        yield CounterMetricFamily("rag_process_cpu_seconds", "User and system CPU time of this process, in seconds",
                                  value=time.process_time())


class MeteredCache(Protocol):
    def stats(self) -> Any:
        """A snapshot with name, hits, misses, evictions, joined and entries."""
        ...


class CacheCollector:
    """Hits, misses, evictions and size of the node's caches."""

    def __init__(self, caches: Callable[[], Iterable[MeteredCache]]):
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


class InfoCollector:
    """rag_node_info = 1, its labels saying what this node runs (to join other series on)."""

    def __init__(self, labels: Callable[[], dict[str, str]]):
        self._labels = labels

    def collect(self):
        labels = self._labels()
        info = GaugeMetricFamily("rag_node_info", "What this node runs (the labels); always 1", labels=list(labels))
        info.add_metric(list(labels.values()), 1)
        yield info


class NodeMetrics:
    """One registry per node process, plus the Flask hooks that feed it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(PeakRssCollector())
        self.registry.register(CpuTimeCollector())
        self.requests = Counter("rag_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("rag_http_request_duration_seconds", "HTTP request latency by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        # vLLM's vllm:prompt_tokens_total and vllm:request_success_total{finished_reason}, under this
        # project's prefix and per endpoint (a forward counts on node 0's route and the worker's
        # /internal/answer): counted for answers sent whole (status 200) whose reply says.
        self.prompt_tokens = Counter("rag_prompt_tokens", "Prompt tokens of the answers sent, by endpoint",
                                     ["endpoint"], registry=self.registry)
        self.success = Counter("rag_request_success", "Answers sent whole, by endpoint and why generation stopped",
                               ["endpoint", "finished_reason"], registry=self.registry)

    def _observe(self, status: int) -> None:
        endpoint = request.url_rule.rule if request.url_rule is not None else "unmatched"
        if endpoint == "/metrics":
            return
        self.requests.labels(endpoint, str(status)).inc()
        record = g.get("completion")
        if status == 200 and record is not None:
            if record.prompt_tokens is not None:
                self.prompt_tokens.labels(endpoint).inc(record.prompt_tokens)
            if record.finish_reason is not None:
                self.success.labels(endpoint, record.finish_reason).inc()
        started = g.get("request_started")
        if started is not None:
            self.latency.labels(endpoint).observe(time.perf_counter() - started)

    def register(self, collector) -> None:
        self.registry.register(collector)

    def instrument(self, app: Flask) -> None:
        """Each request counted and timed once, when its answer is complete: a plain reply when its
        view returns, a stream (services/server/stream_response.py) when its last byte is sent or its
        reader leaves, with the status it ended with."""
        @app.after_request
        def _observe(response):
            if not g.get(STREAMED):
                self._observe(response.status_code)
            return response

        @app.teardown_request
        def _observe_stream(exc):
            # With sse_response the teardown comes when the server closes the response.
            if g.get(STREAMED):
                self._observe(g.get("response_status", 500))

        @app.get("/metrics")
        def metrics():
            return Response(generate_latest(self.registry), mimetype=CONTENT_TYPE.split(";")[0],
                            headers={"Content-Type": CONTENT_TYPE})
