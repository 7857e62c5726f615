"""Prometheus families of the gateway: where it sent requests, each worker's place in the
rotation, and its admission (in flight, joiners, refusals)."""
from __future__ import annotations

from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.roles.gateway.gateway import Gateway


class GatewayCollector:
    """Where the gateway sent requests, whether each worker is in the rotation, and its admission."""

    def __init__(self, gateway: Callable[[], Gateway | None]):
        self._gateway = gateway

    def collect(self):
        gateway = self._gateway()
        if gateway is None:
            return
        yield from self._routing(gateway.status())
        yield from self._admission(gateway.stats())

    @staticmethod
    def _routing(statuses: list[dict]):
        routed = CounterMetricFamily("rag_gateway_routed", "Requests answered by each worker (local: node 0's own "
                                     "worker, called in-process)", labels=["worker", "local"])
        forwarded = CounterMetricFamily("rag_gateway_forwarded", "Requests answered by a worker over HTTP "
                                        "(node 0's in-process calls are not forwards)", labels=["worker"])
        up = GaugeMetricFamily("rag_gateway_worker_up", "1 if the worker is in the rotation", labels=["worker"])
        differ = GaugeMetricFamily("rag_gateway_worker_numerics_differ", "How many of the worker's numerics differ "
                                   "from node 0's own worker's (0: it computes a reply's bits alike)",
                                   labels=["worker"])
        for status in statuses:
            worker = str(status["node"])
            routed.add_metric([worker, "true" if status["local"] else "false"], status["forwarded"])
            if not status["local"]:
                forwarded.add_metric([worker], status["forwarded"])
            up.add_metric([worker], 1 if status["up"] else 0)
            differ.add_metric([worker], len(status["numerics_differ"]))
        yield from (routed, forwarded, up, differ)

    @staticmethod
    def _admission(st: dict):
        gauges = [("rag_gateway_in_flight", "Distinct request_ids being computed", st["in_flight"]),
                  ("rag_gateway_max_in_flight", "GATEWAY_MAX_IN_FLIGHT", st["max_in_flight"]),
                  ("rag_gateway_joining", "Callers waiting on the same request_id in flight", st["joining"])]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("rag_gateway_joined", "Callers that joined a request_id in flight",
                                  value=st["joined"])
        yield CounterMetricFamily("rag_gateway_conflicts", "Requests refused 409: a request_id sent with "
                                  "another query", value=st["conflicts"])
        rejected = CounterMetricFamily("rag_gateway_rejected", "Requests refused 503 at once (capacity: "
                                       "GATEWAY_MAX_IN_FLIGHT; joiners: a joiner cap)", labels=["reason"])
        rejected.add_metric(["capacity"], st["rejected"] - st["rejected_joiners"])
        rejected.add_metric(["joiners"], st["rejected_joiners"])
        yield rejected
