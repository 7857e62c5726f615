"""Shared fixtures for unit/ and integration/: tiny stand-ins (built once into .cache, before any test:
the nodes tests start read them and never build them), small course and support data; and the guard
that fails a test not marked slow which starts a process. Helpers that tests import live in
tests/helpers.py."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub

import pytest
from xdist.scheduler import LoadScopeScheduling

from pipeline.config import Settings
from pipeline.device import Placement
from tests.helpers import TEST_ENV, no_processes, recording_tool_commit

# In-process tools read Settings from the environment too: they get the tests' settings
# (float32, the oracle's precision) unless the runner set them, whatever this CPU would pick.
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)


# ----------------------------------------------------------------------------- the compiled kernels, before any test
def pytest_configure(config):
    """matplotlib's font list made in every process (below); then the C++ kernels (pipeline.kernels.compiled)
    built once, in the controller before any worker starts, so
    that every test, in-process reference and node started sees one build state: the ordered attention sets
    a CPU's bits where it is built. Found built (./run.sh test builds them first), this reads a folder."""
    # matplotlib lists the system's fonts (`fc-list`, a process) the first time it is imported on a machine;
    # importing it here, in every process, keeps that out of the collection, where a started process fails.
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401
    if hasattr(config, "workerinput"):
        return
    from pipeline.kernels.compiled import build_all
    try:
        build_all()
    except Exception as error:  # no compiler: the torch ops run everywhere in this session
        import warnings
        warnings.warn(f"the C++ kernels could not be built ({error}): the torch ops run instead", stacklevel=1)


# ----------------------------------------------------------------------------- the fast subset starts no process
# `-m "not slow"` is the subset that starts no process (setup.cfg's marker): a test not marked slow
# fails if it, its fixtures (setup and teardown) or any thread meanwhile starts one, and a test
# module fails to collect if importing it starts one (collection imports every module, slow or not).


@contextlib.contextmanager
def _unless_slow(item: pytest.Item, phase: str):
    if item.get_closest_marker("slow") is not None:
        yield
        return
    with no_processes(f"{item.nodeid} ({phase}) is not marked slow, yet it") as refused:
        yield
    if refused:  # refused where the code under test caught it, or in another thread
        pytest.fail(f"{item.nodeid} ({phase}) is not marked slow, yet it started processes: {refused}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _unless_slow(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _unless_slow(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with _unless_slow(item, "teardown"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    if not isinstance(collector, pytest.Module):
        return (yield)
    with no_processes(f"importing {collector.nodeid}"):
        return (yield)


# ----------------------------------------------------------------------------- two workers (pytest-xdist)
# `./run.sh test` runs the suite on up to two xdist workers, scheduled by `worker_group`: a group runs
# whole on one worker, groups in collection order. The integration tests but the container module are
# one group: they share clusters and the fork server, one after another, and take about half the suite;
# the container module (Docker's image and compose cluster) and each unit module are groups of their
# own, so the other worker starts on the containers and goes on with the unit modules.
INTEGRATION = "tests/integration/"
ALONE_IN_INTEGRATION = ("tests/integration/test_containers.py",)


def worker_group(nodeid: str) -> str:
    """The group a test runs in: "integration" or its own module's path."""
    module = nodeid.split("::", 1)[0]
    return "integration" if module.startswith(INTEGRATION) and module not in ALONE_IN_INTEGRATION else module


class GroupScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, the scope being worker_group's. (xdist's own xdist_group marks do not
    group under pytest 9: they rename item._nodeid, which pytest 9's nodeid no longer reads.)"""

    def _split_scope(self, nodeid: str) -> str:
        return worker_group(nodeid)


def pytest_xdist_make_scheduler(config, log):
    return GroupScheduling(config, log)


def torch_threads_per_worker() -> int:
    """The cores shared among the xdist workers (PYTEST_XDIST_WORKER_COUNT; one run without xdist: all)."""
    cores = len(os.sched_getaffinity(0))
    return max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


@pytest.fixture
def tool_commit() -> Iterator[dict]:
    """The commit profiling's tools record, without git (helpers.recording_tool_commit)."""
    with recording_tool_commit() as commit:
        yield commit


# ----------------------------------------------------------------------------- models and data


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    import torch
    torch.set_num_threads(torch_threads_per_worker())  # more would only make the workers' threads contend


@pytest.fixture(scope="session")
def tiny_settings() -> Settings:
    # STANDIN_HOME as the nodes the tests start will read it (they inherit the runner's environment).
    home = {"STANDIN_HOME": os.environ["STANDIN_HOME"]} if os.environ.get("STANDIN_HOME") else {}
    return Settings.from_env({**TEST_ENV, **home})


@pytest.fixture(scope="session", autouse=True)
def model_source(tiny_settings):
    """The tiny stand-ins, built first if missing (a second run finds them built at once)."""
    from builders.standins import source_building_standins
    return source_building_standins(tiny_settings)


@pytest.fixture(scope="session")
def fp32() -> Placement:
    return Placement("cpu", "float32")


@pytest.fixture(scope="session")
def embedder(model_source, fp32):
    from pipeline.embedder import Embedder
    return Embedder.load(model_source, fp32)


@pytest.fixture(scope="session")
def reranker(model_source, fp32):
    from pipeline.reranker import Reranker
    return Reranker.load(model_source, fp32)


@pytest.fixture(scope="session")
def generator(model_source, fp32):
    from pipeline.generator import Generator
    return Generator.load(model_source, fp32)


@pytest.fixture(scope="session")
def sentiment(model_source, fp32):
    from pipeline.classifiers import SentimentClassifier
    return SentimentClassifier.load(model_source, fp32)


@pytest.fixture(scope="session")
def toxicity(model_source, fp32):
    from pipeline.classifiers import ToxicityClassifier
    return ToxicityClassifier.load(model_source, fp32)


@pytest.fixture(scope="session")
def reference_texts(generator) -> list[str]:
    """The answers to helpers.engine_requests(), each generated alone: what the continuous engine
    (test_engine) and the generate stage over it (test_continuous) must give."""
    from tests.helpers import engine_requests
    return [generator.generate([r])[0] for r in engine_requests()[1]]


@pytest.fixture(scope="session")
def course_data(tmp_path_factory):
    from builders.data import build_course
    return build_course(tmp_path_factory.mktemp("course"), 3000, seed=0, progress=False)


@pytest.fixture(scope="session")
def support_data(tmp_path_factory, embedder):
    from builders.data import build_support
    return build_support(tmp_path_factory.mktemp("support"), 400, embedder.embed, seed=0, progress=False)


@pytest.fixture(scope="session")
def reference(support_data, embedder, reranker, generator, sentiment, toxicity):
    from pipeline.docstore import DocumentStore
    from pipeline.reference import ReferencePipeline
    from pipeline.vector_index import VectorIndex
    return ReferencePipeline(embedder=embedder, index=VectorIndex.load(support_data.index_path, nprobe=64),
                             store=DocumentStore(support_data.db_path), reranker=reranker,
                             generator=generator, sentiment=sentiment, toxicity=toxicity)
