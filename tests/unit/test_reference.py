"""The reference pipeline answers the eight queries on both data layouts."""
from pipeline import spec
from pipeline.docstore import DocumentStore
from pipeline.reference import ReferencePipeline
from pipeline.vector_index import VectorIndex


def _check(answer, request_id):
    assert answer["request_id"] == request_id
    assert isinstance(answer["generated_response"], str) and answer["generated_response"]
    assert answer["sentiment"] in spec.SENTIMENTS
    assert answer["is_toxic"] in ("true", "false")


def test_reference_on_support_data(reference):
    for i, query in enumerate(spec.REFERENCE_QUERIES[:3]):
        _check(reference.answer(query, f"r{i}"), f"r{i}")
    docs = reference.retrieve(spec.REFERENCE_QUERIES[0])
    assert 1 <= len(docs) <= spec.TOP_K


def test_reference_on_course_data(course_data, reference):
    course = ReferencePipeline(**{**reference.__dict__, "index": VectorIndex.load(course_data.index_path),
                                  "store": DocumentStore(course_data.db_path)})
    docs = course.retrieve(spec.REFERENCE_QUERIES[1])
    assert len(docs) == spec.TOP_K
    assert all(d.title == f"Document {d.doc_id}" for d in docs)
    _check(course.answer(spec.REFERENCE_QUERIES[1], "c1"), "c1")


def test_reference_is_deterministic(reference):
    query = spec.REFERENCE_QUERIES[4]
    assert reference.answer(query, "a") == reference.answer(query, "a")


def test_reference_loads_each_model_as_the_service_would(support_data):
    from pipeline.config import Settings
    from tests.helpers import TEST_ENV, data_env
    settings = Settings.from_env({**TEST_ENV, **data_env(support_data), "GENERATE_PRECISION": "int8-dynamic"})
    pipeline = ReferencePipeline.from_settings(settings)
    assert pipeline.devices() == {**{str(s): "cpu/float32" for s in spec.MODEL_STAGES},
                                  "generate": "cpu/int8-dynamic"}
    _check(pipeline.answer(spec.REFERENCE_QUERIES[0], "p"), "p")


def test_the_reference_searches_a_tuned_version_at_the_manifests_values_as_the_index_node_does(tmp_path):
    """A version tuned after its build (builders.recall tune) keeps nprobe 1 in its file and the tuned nprobe in
    its manifest; the index node serves the manifest's, so the oracle must search at it too."""
    from builders.data import build_course
    from builders.recall import RecallOptions, tune_version
    from pipeline.config import Settings
    from pipeline.data_version import read_manifest
    from pipeline.reference import open_index
    from tests.helpers import TEST_ENV, data_env

    result = build_course(tmp_path / "v1", 1500, dim=16, nlist=16, nprobe=1, progress=False, batch_size=1500,
                          recall=RecallOptions(accept_low=True, queries=100))
    tune_version(tmp_path / "v1", RecallOptions(min_recall=0.95, queries=100))
    tuned = read_manifest(tmp_path / "v1").index["nprobe"]
    assert tuned > 1 and VectorIndex.load(result.index_path, nprobe=None).nprobe == 1
    env = {k: v for k, v in TEST_ENV.items() if k not in ("NPROBE", "EF_SEARCH")}
    assert open_index(Settings.from_env({**env, **data_env(result)})).nprobe == tuned
    assert open_index(Settings.from_env({**env, **data_env(result), "NPROBE": "3"})).nprobe == 3
