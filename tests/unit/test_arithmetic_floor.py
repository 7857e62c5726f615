"""A decode step's arithmetic floor: the peak multiply-add rate of each product kernel's instruction
(profiling/lib/arithmetic_peaks.py), the multiply-adds a step's products make (profiling/lib/engine_step.py's
ProductRecorder) and the floor and bound they give (profiling/lib/decode_floor.py)."""
from __future__ import annotations

import shutil

import pytest
import torch

from profiling.lib import arithmetic_peaks as peaks
from profiling.lib import decode_floor as df
from profiling.lib.engine_step import ProductRecorder

HERE = [name for name, spec in peaks.INSTRUCTIONS.items() if spec.flags <= peaks.cpu_flags()]
BUILDS = pytest.mark.slow  # building the probes runs g++: a process
NEEDS_GXX = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++: the probes cannot be built")


@pytest.mark.parametrize("name", HERE)
@pytest.mark.parametrize("threads", [1, 2])
@BUILDS
@NEEDS_GXX
def test_each_loop_runs_its_instruction_the_times_it_is_asked_on_every_thread(name, threads):
    # ones times ones: the lanes' sum is the multiply-adds that ran, on every accumulator of every thread
    macs = peaks.INSTRUCTIONS[name].macs
    assert peaks.run_loop(name, 1000, threads) == 1000 * peaks.ACCUMULATORS * macs * threads
    assert peaks.run_loop(name, 3, threads) == 3 * peaks.ACCUMULATORS * macs * threads


@BUILDS
@NEEDS_GXX
def test_a_rate_is_positive_where_the_cpu_has_the_instruction_and_none_where_it_lacks_it(monkeypatch):
    assert HERE, "every x86-64 machine this project runs on has AVX2"
    for name in HERE:
        assert peaks.mac_rate(name, 1, seconds=0.01, rounds=1) > 1e8
    monkeypatch.setattr(peaks, "cpu_flags", lambda: frozenset({"avx2"}))
    assert peaks.mac_rate("vdpbf16ps", 1) is None and peaks.mac_rate("vpdpbusd", 1) is None
    rates = peaks.product_rates(1)
    assert set(rates) == {"avx2_linear", "avx2_int4_linear"}  # the AVX2 kernels' ops, one rate for both
    assert rates["avx2_linear"] == rates["avx2_int4_linear"] > 0


def test_without_a_compiler_no_rate_is_given(monkeypatch):
    monkeypatch.setattr(peaks.shutil, "which", lambda _: None)
    peaks.library.cache_clear()
    try:
        assert peaks.library() is None and peaks.product_rates(1) == {}
        with pytest.raises(RuntimeError, match="no g\\+\\+"):
            peaks.run_loop("vpmaddubsw", 1, 1)
    finally:
        peaks.library.cache_clear()


def test_every_instruction_named_for_a_product_op_is_probed_and_the_op_is_a_product():
    from profiling.lib.engine_step import PRODUCT_OPS
    assert set(peaks.PRODUCT_INSTRUCTIONS.values()) <= set(peaks.INSTRUCTIONS)
    assert set(peaks.PRODUCT_INSTRUCTIONS) <= PRODUCT_OPS


def test_the_recorder_counts_each_products_multiply_adds_by_op():
    x, weight, bias = torch.randn(3, 16), torch.randn(8, 16), torch.randn(8)
    recorder = ProductRecorder()
    with recorder.mode:
        torch.nn.functional.linear(x, weight, bias)  # addmm(bias, x, w.t())
        torch.nn.functional.linear(x, weight)  # mm(x, w.t())
        torch.nn.functional.linear(x[:1], weight)
        torch.randn(5, 5).sum()  # not a product
    assert dict(recorder.macs) == {"addmm": 3 * 16 * 8, "mm": 3 * 16 * 8 + 16 * 8}
    assert len(recorder.calls) == 3


@pytest.mark.parametrize("kernel", ["vnni", "avx2"])
def test_the_recorder_counts_the_project_kernels_products(kernel):
    from pipeline.kernels.int8 import Int8DynamicLinear
    layer = Int8DynamicLinear(torch.nn.Linear(32, 64), kernel=kernel)
    if layer.kernel != kernel:
        pytest.skip(f"the {kernel} int8 kernel is not built for this CPU")
    recorder = ProductRecorder()
    with recorder.mode:
        layer(torch.randn(5, 32))
    assert dict(recorder.macs) == {f"{kernel}_linear": 5 * 32 * 64}


def test_the_arithmetic_floor_is_each_ops_multiply_adds_over_its_rate():
    assert df.arithmetic_floor_ms({"bf16_linear": 4e9}, {"bf16_linear": 2e11}) == pytest.approx(20.0)
    both = df.arithmetic_floor_ms({"vnni_linear": 4e9, "bf16_linear": 1e9},
                                  {"vnni_linear": 4e11, "bf16_linear": 2e11, "avx2_linear": 1.0})
    assert both == pytest.approx(10.0 + 5.0)
    # an op of unknown rate (oneDNN's), or nothing counted: no floor
    assert df.arithmetic_floor_ms({"bf16_linear": 4e9, "_linear_pointwise": 1}, {"bf16_linear": 2e11}) is None
    assert df.arithmetic_floor_ms(None, {"bf16_linear": 2e11}) is None
    assert df.arithmetic_floor_ms({}, {"bf16_linear": 2e11}) is None


def test_the_bound_is_the_larger_floor_for_the_step_and_for_its_products():
    floor = df.step_floor(10 ** 9, [100], kv_per_token=1000, bandwidth=20e9)  # 50.005 ms; weights alone 50 ms
    below = df.floor_fields(floor, step_ms=75.0, products_ms=60.0, arithmetic_ms=20.0)
    assert (below["arithmetic_floor_ms"], below["step_over_bound"], below["products_over_bound"]) == (20.0, 1.5, 1.2)
    above = df.floor_fields(floor, step_ms=75.0, products_ms=60.0, arithmetic_ms=60.0)
    assert (above["step_over_bound"], above["products_over_bound"], above["step_over_floor"]) == (1.25, 1.0, 1.5)
    untimed = df.floor_fields(floor, step_ms=75.0, products_ms=None, arithmetic_ms=60.0)
    assert (untimed["step_over_bound"], untimed["products_over_bound"]) == (1.25, None)
    row = {"precision": "bfloat16", "sequences": 8, "step_ms": 75.0, "products_ms": 60.0, **above}
    assert df.format_floor_rows([row]).splitlines()[2].split()[5:9] == ["1.50", "-", "60.00", "1.25"]
    assert set(row) | {"floor_gb_s", "median_gb_s", "step_over_median_floor", "product_macs", "context_tokens"} \
        >= set(df.TABLE_KEYS)


def test_add_floors_takes_each_rows_counted_multiply_adds():
    from transformers import Qwen2Config
    config = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    model = torch.nn.Linear(32, 32)
    model.config = config
    rows = [{"step_ms": 1.0, "products_ms": 0.5, "context_tokens": 10, "product_macs": {"bf16_linear": 2e8}},
            {"step_ms": 1.0, "products_ms": 0.5, "context_tokens": 10, "product_macs": {"_linear_pointwise": 2e8}},
            {"step_ms": 1.0, "products_ms": None, "context_tokens": 10}]
    df.add_floors(rows, model, 1e9, {"bf16_linear": 1e11})
    assert [r["arithmetic_floor_ms"] for r in rows] == [2.0, None, None]
    assert rows[0]["step_over_bound"] == pytest.approx(1.0 / max(2.0, rows[0]["floor_ms"]), abs=0.01)


def test_the_flags_the_probes_need_are_read_from_cpuinfo(tmp_path):
    from pipeline.cpu_features import cpu_flags
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nflags\t: other\n")
    assert cpu_flags(tmp_path / "cpuinfo") == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


@BUILDS
@NEEDS_GXX
def test_the_build_leaves_no_files_behind(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the build's temporary folder goes
    peaks.library.cache_clear()
    try:
        assert peaks.run_loop("vpmaddubsw", 3, 1) == 3 * peaks.ACCUMULATORS * peaks.INSTRUCTIONS["vpmaddubsw"].macs
        assert not list(tmp_path.iterdir())  # the loaded library outlives its file
    finally:
        peaks.library.cache_clear()
