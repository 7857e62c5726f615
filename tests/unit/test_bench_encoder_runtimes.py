"""ONNX Runtime against PyTorch for the encoder stages (profiling/bench_encoder_runtimes.py).

On the tiny stand-ins: each encoder exported to ONNX gives PyTorch float32's outputs under
ORT, its ORT int8 runs and stays close, the adoption rule decides both ways on hand-made
figures, and the command line writes its JSON.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from pipeline import spec  # noqa: E402
from profiling import bench_encoder_runtimes as bench  # noqa: E402
from profiling.lib import runtimes as rt  # noqa: E402
from tests.helpers import TEST_ENV  # noqa: E402

SIZES = (1, 3)


@pytest.fixture(scope="module", params=rt.STAGES)
def exported(request, model_source, tmp_path_factory):
    """One stage: its float32 stage object, workload, PyTorch runner and both ORT runners."""
    stage = request.param
    obj = rt.load_stage(stage, model_source, "float32")
    work = rt.build_workload(stage, obj, SIZES, queries=2)
    module = rt.forward_module(stage, obj.model, work.names)
    folder = tmp_path_factory.mktemp(f"onnx-{stage}")
    (folder / "f32").mkdir(), (folder / "i8").mkdir()
    rt.export_onnx(module, work.timed[SIZES[1]], work.names, folder / "f32" / "model.onnx", rt.default_opset())
    rt.quantize_onnx(folder / "f32" / "model.onnx", folder / "i8" / "model.onnx", per_channel=True)
    return {"stage": stage, "obj": obj, "work": work, "torch": rt.torch_runner(module, work.names),
            "ort32": rt.ort_runner(folder / "f32" / "model.onnx", 2), "ort8": rt.ort_runner(folder / "i8" / "model.onnx", 2),
            "folder": folder}


def _feeds(work):
    return list(work.timed.values()) + work.fidelity_feeds  # unpadded single items and padded batches


def test_the_wrapped_network_gives_the_stage_its_own_answers(exported):
    stage, obj, work = exported["stage"], exported["obj"], exported["work"]
    items = rt.stage_items(stage, SIZES[1])
    out = exported["torch"](work.timed[SIZES[1]])
    if stage == "embed":
        np.testing.assert_allclose(out, obj.embed(items), atol=1e-5)
    elif stage == "rerank":
        np.testing.assert_allclose(out.reshape(-1), obj.score_pairs(items), atol=1e-5)
    else:
        np.testing.assert_allclose(out, obj.logits(items).numpy(), atol=1e-5)


def test_ort_float32_matches_pytorch_float32(exported):
    for feed in _feeds(exported["work"]):
        expected = exported["torch"](feed)
        got = exported["ort32"](feed)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_ort_int8_runs_quantized_yet_close_and_smaller(exported):
    stage = exported["stage"]
    for feed in _feeds(exported["work"]):
        expected, got = exported["torch"](feed), exported["ort8"](feed)
        assert got.shape == expected.shape and np.isfinite(got).all()
        assert not np.allclose(got, expected, rtol=0, atol=1e-6)  # really quantized, not the float graph
        if stage == "embed":
            cos = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
            assert (cos > 0.98).all(), cos
        else:
            assert np.abs(got - expected).max() < 0.1 * max(1.0, np.abs(expected).max())
    f32, i8 = (rt._folder_mib(exported["folder"] / name) for name in ("f32", "i8"))
    assert i8 < f32


# ------------------------------------------------------------------------- the rule on hand-made figures

def _fig(runtime, one_ms, batch_ms, drift=1e-6, **fid) -> rt.RuntimeFigures:
    return rt.RuntimeFigures("rerank", runtime, one_ms, batch_ms, fid or {"top3_agreement": 1.0, "spearman": 1.0},
                             prepare_s=0.0, model_mib=1.0, batch_drift=drift)


BASE = dict(top3_agreement=0.9, spearman=0.95)


def test_an_ort_variant_fast_enough_at_both_sizes_and_as_faithful_is_adopted():
    figures = [_fig(rt.REFERENCE, 100, 400), _fig(rt.BASELINE, 50, 200, **BASE),
               _fig("ort-float32", 38, 150), _fig("ort-int8", 30, 100, **BASE)]
    v = rt.verdict("rerank", figures, 1.3)
    assert v.adopt == "ort-int8"  # both pass; the faster at the batch wins
    assert "passes" in v.reasons["ort-float32"] and "passes" in v.reasons["ort-int8"]
    only_float = [*figures[:3], _fig("ort-int8", 30, 100, top3_agreement=0.9, spearman=0.94)]
    v = rt.verdict("rerank", only_float, 1.3)
    assert v.adopt == "ort-float32" and "spearman 0.94 < int8's 0.95" in v.reasons["ort-int8"]


def test_too_slow_at_one_size_or_less_faithful_keeps_pytorch():
    slow_one = [_fig(rt.BASELINE, 50, 200, **BASE), _fig("ort-float32", 40, 100), _fig("ort-int8", 39, 100, **BASE)]
    v = rt.verdict("rerank", slow_one, 1.3)
    assert v.adopt is None
    assert "one 1.25x < 1.3x" in v.reasons["ort-float32"] and "one 1.28x < 1.3x" in v.reasons["ort-int8"]
    unfaithful = [_fig(rt.BASELINE, 50, 200, **BASE), _fig("ort-int8", 10, 40, top3_agreement=0.8, spearman=0.99)]
    v = rt.verdict("rerank", unfaithful, 1.3)
    assert v.adopt is None and "top3_agreement 0.8 < int8's 0.9" in v.reasons["ort-int8"]
    assert v.reasons["ort-float32"] == "not measured"
    nan = [_fig(rt.BASELINE, 50, 200, **BASE), _fig("ort-int8", 10, 40, top3_agreement=math.nan, spearman=1.0)]
    assert rt.verdict("rerank", nan, 1.3).adopt is None  # a metric not measured is not "at least as good"


def test_a_variant_whose_outputs_move_with_their_batch_mates_keeps_pytorch():
    per_tensor = [_fig(rt.BASELINE, 50, 200, drift=2e-6, **BASE), _fig("ort-int8", 10, 40, drift=3e-2, **BASE),
                  _fig("ort-float32", 20, 80, drift=8e-6)]
    v = rt.verdict("rerank", per_tensor, 1.3)
    assert v.adopt == "ort-float32"  # padding noise within the slack passes
    assert "batch drift 0.03 > int8's 2e-06" in v.reasons["ort-int8"]


# ------------------------------------------------------------------------- the command line

def test_options_are_checked(tmp_path):
    assert bench.parse_sizes("embed=2:32")["embed"] == (2, 32)
    assert bench.parse_sizes("embed=2:32")["rerank"] == rt.DEFAULT_SIZES["rerank"]
    for bad in ("embed=4:4", "embed=0:3", "generate=1:2", "embed=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="STAGE=ONE:BATCH"):
            bench.parse_sizes(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="must not go into the repository"):
        bench._export_dir(str(bench.REPO / "exports"))
    assert bench._export_dir(str(tmp_path)) == tmp_path.resolve()
    text = bench.parser().format_help()
    for option in ("--stages", "--sizes", "--repeat", "--queries", "--min-speedup", "--opset", "--per-channel",
                   "--export-dir", "--out"):
        assert option in text


def test_cli_on_tiny_standins_prints_verdicts_and_writes_json(tmp_path, model_source, capsys):
    rc = bench.main(["--stages", "embed,toxicity", "--sizes", "embed=1:2,toxicity=1:2", "--repeat", "1",
                     "--queries", "2", "--out", str(tmp_path / "out"), "--export-dir", str(tmp_path / "exports")],
                    env=dict(TEST_ENV))
    assert rc == 0
    (run,) = (tmp_path / "out").iterdir()
    data = json.loads((run / "encoder_runtimes.json").read_text())
    assert set(data["stages"]) == {"embed", "toxicity"} and set(data["verdicts"]) == {"embed", "toxicity"}
    for stage, result in data["stages"].items():
        figures = {f["runtime"]: f for f in result["figures"]}
        assert set(figures) == set(rt.RUNTIMES)
        assert all(f["one_ms"] > 0 and f["batch_ms"] > 0 and f["model_mib"] > 0 for f in figures.values())
        assert figures[rt.REFERENCE]["fidelity"] == ({"cosine_min": pytest.approx(1.0), "cosine_mean": pytest.approx(1.0)}
                                                     if stage == "embed" else {"label_agreement": 1.0})
        assert data["verdicts"][stage] == (result["verdict"]["adopt"] or "pytorch")
        assert result["tokens"]["1"] > 2 and result["export_s"] > 0 and result["quantize_s"] > 0
        assert all(0 <= f["batch_drift"] < 1 for f in figures.values())  # measured, alone against the batch
    (exports,) = (tmp_path / "exports").iterdir()  # kept where asked, one folder per stage and precision
    assert sorted(p.relative_to(exports).as_posix() for p in exports.rglob("model.onnx")) == [
        "embed/float32/model.onnx", "embed/int8/model.onnx", "toxicity/float32/model.onnx", "toxicity/int8/model.onnx"]
    printed = capsys.readouterr().out
    assert "x int8 B" in printed and "rule: adopt an ONNX Runtime variant" in printed
    assert any(line.startswith("embed: ") for line in printed.splitlines())
    assert spec.Stage.TOXICITY in printed
