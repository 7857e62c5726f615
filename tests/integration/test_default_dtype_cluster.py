"""The cluster as users run it: PRECISION=auto, which on a CPU with bf16 (avx512_bf16 or AMX) is
bfloat16 in every stage. Under concurrency, each reply equals the reference pipeline's
at the same dtype: text, sentiment and toxicity do not depend on which requests shared a batch."""
from __future__ import annotations

import pytest
import requests

from pipeline import spec
from pipeline.config import Settings
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.reference import ReferencePipeline
from tests.helpers import TEST_ENV, assert_concurrent_replies_equal_reference, data_env, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not cpu_supports_bf16(), reason="PRECISION=auto is float32 on a CPU without "
                                 "avx512_bf16 or AMX, which the other cluster tests cover")]

# The default, spelled out: the tests' environment pins PRECISION=float32 (tests/helpers.py).
DEFAULT = {"PRECISION": "auto"}


@pytest.fixture(scope="module")
def default_cluster(support_data, tmp_path_factory):
    cluster = start_cluster(support_data, tmp_path_factory.mktemp("default-dtype-logs"),
                            RERANK_MAX_WAIT_MS="20", EMBED_MAX_WAIT_MS="20",
                            SENTIMENT_MAX_WAIT_MS="20", TOXICITY_MAX_WAIT_MS="20", **DEFAULT)
    yield cluster
    cluster.stop()


def test_default_dtype_cluster_answers_under_concurrency_as_the_reference_at_that_dtype(default_cluster,
                                                                                         support_data):
    devices = requests.get(f"{default_cluster.url(1)}/health", timeout=10).json()["device"]
    assert devices == {stage: "cpu/bfloat16" for stage in spec.MODEL_STAGES}
    reference = ReferencePipeline.from_settings(Settings.from_env({**TEST_ENV, **data_env(support_data), **DEFAULT}))
    assert {reference.embedder.placement.dtype, reference.generator.placement.dtype} == {"bfloat16"}
    queries = list(spec.REFERENCE_QUERIES[:6])
    assert_concurrent_replies_equal_reference(default_cluster.url(0), reference, queries, "auto")
