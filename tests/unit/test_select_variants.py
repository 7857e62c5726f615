"""profiling.select_variants: the fidelity metrics, the selection rule, the env file, one quick run."""
from __future__ import annotations

import json
import math
import os
import subprocess

import numpy as np
import pytest

from pipeline import spec
from profiling import select_variants
from profiling.lib import fidelity as fid
from profiling.lib.fidelity import DEFAULT_THRESHOLDS, Measurement, check, choose, env_file
from tests.helpers import TEST_ENV

# ------------------------------------------------------------------------- metrics

def test_top3_agreement_counts_shared_members_not_their_order():
    ref = [0.9, 0.8, 0.7, 0.1, 0.0]
    assert fid.top_k_agreement(ref, [0.7, 0.8, 0.9, 0.1, 0.0]) == 1.0  # same three, reversed
    assert fid.top_k_agreement(ref, [0.9, 0.8, 0.0, 0.1, 0.7]) == pytest.approx(2 / 3)  # doc 2 swapped for doc 4
    assert fid.top_k_agreement(ref, [0.0, 0.0, 0.0, 0.9, 0.8]) == pytest.approx(1 / 3)  # ties keep order: 0 stays


def test_rank_correlations_on_hand_made_rankings():
    ref = [5.0, 4.0, 3.0, 2.0, 1.0]
    assert fid.spearman(ref, ref) == fid.kendall(ref, ref) == 1.0
    assert fid.spearman(ref, ref[::-1]) == fid.kendall(ref, ref[::-1]) == -1.0
    one_swap = [5.0, 4.0, 2.0, 3.0, 1.0]  # items 2 and 3 swap: 1 discordant pair of 10
    assert fid.kendall(ref, one_swap) == pytest.approx(0.8)
    assert fid.spearman(ref, one_swap) == pytest.approx(1 - 6 * 2 / (5 * 24))
    # against scipy where it is installed
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(10), rng.standard_normal(10)
    assert fid.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert fid.kendall(a, b) == pytest.approx(stats.kendalltau(a, b).statistic)


def test_first_differing_token_and_exact_matches():
    assert fid.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert fid.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert fid.first_difference([1, 2, 3], [1, 2]) == 2  # the shorter answer stopped early
    def read(ids, top1=(5, 6), logits=(1.0, 0.0)):
        return {"ids": ids, "prompt_top1": list(top1), "last_logits": np.array(logits)}
    figures = fid.fidelity("generate", [read([1, 2, 3]), read([4, 5]), read([6, 7, 8])],
                           [read([1, 2, 3]), read([4, 6], top1=(5, 7)), read([9, 7, 8], logits=(1.0, 0.5))])
    assert figures == {"exact_match": pytest.approx(1 / 3), "first_diff_min": 0.0, "first_diff_median": 0.5,
                       "teacher_top1": pytest.approx(5 / 6), "logit_drift_max": pytest.approx(0.5)}
    same = fid.fidelity("generate", [read([1])], [read([1])])
    assert same["exact_match"] == 1.0 and math.isnan(same["first_diff_min"])
    assert same["teacher_top1"] == 1.0 and same["logit_drift_max"] == 0.0


def test_embedding_cosine_and_label_agreement():
    ref = np.array([[1.0, 0.0], [0.0, 2.0]])
    figures = fid.fidelity("embed", ref, np.array([[1.0, 0.0], [1.0, 1.0]]))
    assert figures["cosine_min"] == pytest.approx(math.sqrt(0.5)) and figures["cosine_mean"] > figures["cosine_min"]
    assert fid.fidelity("sentiment", ["neutral", "positive"], ["neutral", "negative"]) == {"label_agreement": 0.5}
    rerank = fid.fidelity("rerank", [[3.0, 2.0, 1.0, 0.0]], [[3.0, 2.0, 0.0, 1.0]])
    assert rerank["top3_agreement"] == pytest.approx(2 / 3) and rerank["spearman"] == pytest.approx(0.8)


# ------------------------------------------------------------------------- the rule

def _m(stage, variant, batch_ms, **figures):
    return check(Measurement(stage, variant, 1.0, batch_ms, 8, 500.0, 100.0, figures), DEFAULT_THRESHOLDS)


def test_the_fastest_passing_variant_is_chosen():
    rows = [_m("embed", "float32", 100.0), _m("embed", "bfloat16", 40.0, cosine_min=0.95),
            _m("embed", "int8-dynamic", 60.0, cosine_min=0.999), _m("embed", "int8-weight", 70.0, cosine_min=0.999)]
    assert not rows[1].passed and rows[1].failed == ["cosine_min 0.95 < 0.99"]
    assert choose(rows) == {"embed": "int8-dynamic"}  # bfloat16 is faster but fails


def test_float32_when_no_variant_passes_or_none_is_faster():
    rows = [_m("generate", "float32", 100.0), _m("generate", "int8-dynamic", 30.0, exact_match=0.5),
            _m("generate", "bfloat16", 20.0)]  # a missing metric fails too
    assert not rows[2].passed
    slower = [_m("toxicity", "float32", 10.0), _m("toxicity", "bfloat16", 12.0, label_agreement=1.0)]
    assert choose(rows + slower) == {"generate": "float32", "toxicity": "float32"}


ENV_FILE = "# machine: x\n#\n# rule: y\nEMBED_PRECISION=int8-dynamic\nGENERATE_PRECISION=float32\n"


def test_env_file_is_comments_then_one_setting_per_stage():
    assert env_file({"embed": "int8-dynamic", "generate": "float32"}, ["machine: x", "", "rule: y"]) == ENV_FILE


@pytest.mark.slow  # runs bash
def test_bash_sources_the_env_file(tmp_path):
    path = tmp_path / "precision.env"
    path.write_text(ENV_FILE)
    sourced = subprocess.run(["bash", "-c", f"set -a; . {path}; echo $EMBED_PRECISION $GENERATE_PRECISION"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert sourced == ["int8-dynamic", "float32"]


def test_options_are_checked():
    p = select_variants.parser()
    assert p.parse_args(["--batch", "embed=3"]).batch == {**select_variants.DEFAULT_BATCH, "embed": 3}
    for bad in (["--batch", "embed=0"], ["--batch", "search=2"], ["--stages", "fetch"], ["--repeat", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    assert p.parse_args(["--rerank-top3-agreement", "0.5"]).min_rerank_top3_agreement == 0.5


# ------------------------------------------------------------------------- one quick run

def test_the_llm_is_timed_and_read_through_the_continuous_engine(generator, monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("Hugging Face generate is not what serves")

    monkeypatch.setattr(generator, "generate_ids", refused)
    items, run, outputs_of = select_variants._workload("generate", generator, 3, 4, 2, 64)
    assert len(items) == 3 and all(isinstance(i, int) for i in items[0])
    assert [len(ids) for ids in run(items[:2])] == [4, 4]  # every answer decodes max_new tokens
    outputs = outputs_of(items[:2])
    assert [len(o["ids"]) for o in outputs] == [4, 4] and len(outputs[0]["prompt_top1"]) == len(items[0])


def test_a_classifier_is_timed_on_answer_texts_and_agrees_with_itself(sentiment):
    items, run, outputs_of = select_variants._workload("sentiment", sentiment, 3, 4, 2, 64)
    assert len(items) == 3 and all(isinstance(text, str) and text for text in items)
    labels = outputs_of(items)
    assert run(items) == labels and set(labels) <= set(spec.SENTIMENTS)
    assert fid.fidelity("sentiment", labels, outputs_of(items)) == {"label_agreement": 1.0}


@pytest.mark.slow  # each variant is measured in a process of its own (and git names the commit)
@pytest.mark.timeout(600)
def test_cli_on_tiny_standins_writes_the_table_and_an_env_file(tmp_path, model_source, capsys):
    env = {**TEST_ENV, "TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # One stage, two variants: two processes (the classifier's workload is checked in-process above).
    rc = select_variants.main(["--stages", "embed", "--variants", "float32,int8-dynamic", "--queries", "4",
                               "--repeat", "1", "--batch", "embed=2", "--out", str(tmp_path)],
                              env={**os.environ, **env})
    assert rc == 0
    printed = capsys.readouterr().out
    assert "NOT a worst case" in printed and "rule:" in printed
    (run,) = tmp_path.iterdir()
    lines = (run / "precision.env").read_text().splitlines()
    settings = [line for line in lines if not line.startswith("#")]
    assert [s.split("=")[0] for s in settings] == ["EMBED_PRECISION"]
    assert all(s.split("=")[1] in ("float32", "int8-dynamic") for s in settings)
    assert any("model source: standin (tiny)" in line for line in lines)
    report = json.loads((run / "select_variants.json").read_text())
    assert report["provenance"]["settings"]["TORCH_THREADS"] == "1"  # the settings it measured under
    assert len(report["provenance"]["tool"]["commit"]) >= 7
    rows = {(r["stage"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {("embed", v) for v in ("float32", "int8-dynamic")}
    assert all(r["batch_ms"] > 0 and r["one_ms"] > 0 and r["peak_rss_mib"] > r["model_mib"] > 0 for r in rows.values())
    # int8 weights take a quarter of float32's bytes in the Linears: the model is smaller
    assert rows[("embed", "int8-dynamic")]["model_mib"] < rows[("embed", "float32")]["model_mib"]
    int8 = rows[("embed", "int8-dynamic")]["fidelity"]
    # on stand-ins the cosine's drift is scaled by the committed real-weights factor (docs/real_fidelity.json)
    assert 0.99 < int8["standin_cosine_min"] <= 1.0 + 1e-6 and int8["cosine_min"] < int8["standin_cosine_min"]
    assert any("what real weights showed" in line for line in lines)
    assert rows[("embed", "float32")]["fidelity"]["cosine_min"] == pytest.approx(1.0)  # the reference itself
    assert (run / "select_variants.csv").read_text().startswith("stage,variant,one_ms")


def test_int4_weight_is_a_default_candidate_where_the_cpu_runs_its_kernel(monkeypatch):
    from pipeline.config import Settings
    from pipeline.cpu_features import cpu_runs_int4
    from pipeline.precision_policy import supported_variants
    env = {**TEST_ENV, "ONLY_CPU": "true"}
    p = select_variants.parser()
    args = select_variants.resolve_args(p, p.parse_args(["--stages", "generate", "--real-fidelity", ""]),
                                        Settings.from_env(env))
    assert args.variants[0] == "float32" and set(args.variants) == set(supported_variants("cpu"))
    assert ("int4-weight" in args.variants) is cpu_runs_int4()
    assert "int4-weight" not in supported_variants("cpu", int4_cpu=lambda: False)
