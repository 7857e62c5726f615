"""Fixtures shared by the unit tests of a worker's request path (test_request_path, test_worker_scoring)."""
from __future__ import annotations

import pytest

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
