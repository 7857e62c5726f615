"""A cluster running every model (the LLM too) in int8 answers as the reference pipeline with the same settings."""
from __future__ import annotations

import pytest
import requests

from pipeline import spec
from pipeline.config import Settings
from pipeline.reference import ReferencePipeline
from tests.helpers import TEST_ENV, assert_concurrent_replies_equal_reference, data_env, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Named, not PRECISION=fast: the same variant whatever this machine's fast table says. The LLM is
# int8 too, under concurrency: its continuous engine (padded, chunked KV cache, sequences joining
# and leaving) must answer exactly as one request alone in the reference, token for token.
INT8 = {f"{stage}_PRECISION": "int8-dynamic" for stage in ("EMBED", "RERANK", "GENERATE", "SENTIMENT", "TOXICITY")}


@pytest.fixture(scope="module")
def int8_cluster(support_data, tmp_path_factory):
    cluster = start_cluster(support_data, tmp_path_factory.mktemp("precision-logs"),
                            RERANK_MAX_WAIT_MS="20", **INT8)
    yield cluster
    cluster.stop()


def test_int8_cluster_llm_included_answers_under_concurrency_as_the_int8_reference(int8_cluster, support_data):
    devices = requests.get(f"{int8_cluster.url(1)}/health", timeout=10).json()["device"]
    assert devices == {stage: "cpu/int8-dynamic" for stage in spec.MODEL_STAGES}
    reference = ReferencePipeline.from_settings(Settings.from_env({**TEST_ENV, **data_env(support_data), **INT8}))
    assert reference.embedder.placement.precision == reference.generator.placement.precision == "int8-dynamic"
    queries = list(spec.REFERENCE_QUERIES[:5])
    assert_concurrent_replies_equal_reference(int8_cluster.url(0), reference, queries, "q8")
