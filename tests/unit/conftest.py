"""Fixtures shared by unit test modules: a worker's request path (test_request_path, test_worker_scoring) and the
continuous engine over the tiny generator, in each CPU variant (test_sampling, test_logprobs)."""
from __future__ import annotations

import pytest

from pipeline.continuous import ContinuousEngine
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.device import Placement
from pipeline.generator import Generator
from pipeline.precision_policy import LOAD_DTYPE
from pipeline.stages import Stages
from pipeline.vector_index import VectorIndex
from tests.helpers import InProcessIndex
from tests.support.running_worker import running_worker


@pytest.fixture
def stages(embedder, reranker, generator, sentiment, toxicity) -> Stages:
    """The five tiny stand-in models, as a worker holds them."""
    return Stages(embedder=embedder, reranker=reranker, generator=generator, sentiment=sentiment, toxicity=toxicity)


@pytest.fixture
def worker(support_data, stages):
    """A worker at the default settings, node 2's index searched in-process."""
    with running_worker(support_data, stages, InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=64)),
                        {}) as running:
        yield running


BF16_CPU = pytest.mark.skipif(not cpu_supports_bf16(), reason="this CPU has no avx512_bf16 or AMX: bfloat16 is "
                                                              "emulated here, and oneDNN refuses its packed products")


@pytest.fixture(scope="module", params=("float32", pytest.param("bfloat16", marks=BF16_CPU), "int8-dynamic",
                                        "int8-weight"))
def variant_engine(request, model_source):
    """An engine over the tiny generator in each CPU variant, one a module."""
    generator = Generator.load(model_source, Placement("cpu", LOAD_DTYPE[request.param], request.param))
    return ContinuousEngine(generator, max_batch=8, kv_cache_tokens=8192, prefill_chunk=64)


@pytest.fixture(scope="module")
def engine(generator):
    """An engine over the tiny float32 generator, one a module."""
    return ContinuousEngine(generator, max_batch=8, kv_cache_tokens=8192, prefill_chunk=64)
