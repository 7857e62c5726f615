"""TRACING=otlp in a real node process, configured only by OpenTelemetry's own variables: an index
node (its own process, the usual `python -m services.node`) with OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and a trace-id ratio sampler sends its spans over
OTLP/HTTP to a receiver on 127.0.0.1 written here; the trace the ratio keeps arrives, the one it
drops does not."""
from __future__ import annotations

import time

import pytest
import requests

from tests.helpers import cluster_env
from tests.support.otlp_receiver import OtlpReceiver
from tools.local import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# traceidratio keeps a trace when its id's low 64 bits are below ratio * 2**64 (the SDK's rule, the
# same in every OpenTelemetry SDK): at 0.5, ...0001 is kept and ...ffff dropped, whatever the caller says.
KEPT = "4bf92f3577b34da6" + "0000000000000001"
DROPPED = "4bf92f3577b34da6" + "ffffffffffffffff"


@pytest.fixture
def receiver():
    with OtlpReceiver() as receiver:
        yield receiver


def test_an_index_node_sends_its_spans_where_the_otel_variables_say(course_data, receiver, tmp_path):
    env = cluster_env(course_data, TRACING="otlp", TRACING_ENDPOINT="", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
                      OTEL_SERVICE_NAME="rag-index-east", OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
                      OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5")
    cluster = LocalCluster(env, tmp_path)
    try:
        cluster.start_node(2)
        cluster.wait_healthy([2], timeout_s=180)
        for trace_id in (KEPT, DROPPED):
            reply = requests.get(f"{cluster.url(2)}/live", headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
                                 timeout=10)
            assert reply.status_code == 200
        # The batch processor sends about once a second (OTLP_SCHEDULE_DELAY_MS); bounded wait.
        deadline = time.monotonic() + 30
        while not any(span.name == "GET /live" for _, span in receiver.spans()):
            assert time.monotonic() < deadline, f"no span arrived:\n{cluster.log_path(2).read_text()[-3000:]}"
            time.sleep(0.2)
        cluster.stop()  # a node's exit flushes what is left, so a dropped trace had every chance to arrive
    finally:
        cluster.stop()
    live = [(resource, span) for resource, span in receiver.spans() if span.name == "GET /live"]
    assert [span.trace_id.hex() for _, span in live] == [KEPT]
    resource, span = live[0]
    assert resource["service.name"] == "rag-index-east" and resource["deployment.environment"] == "test"
    assert resource["rag.node.role"] == "index" and resource["rag.node"] == 2
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"  # the caller's traceparent continued
    assert "traceidratio" in cluster.log_path(2).read_text().lower()  # the startup line names the sampler
