"""The decode-step benchmark (profiling/bench_decode) runs end to end on tiny stand-ins and reports what it
promises; --baselines times kernels switched back to their baselines, interleaved on one model."""
import json

import pytest

from tests.helpers import TEST_ENV


@pytest.mark.slow  # main() builds the arithmetic probes with g++
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("tool_commit")
def test_bench_decode_times_steps_by_phase_and_profiles(tmp_path, model_source, monkeypatch):
    from profiling import bench_decode
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_decode.main(["--sequences", "1,3", "--repeat", "2", "--profile", "--profile-steps", "1",
                              "--top", "5", "--bandwidth-mib", "16", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_decode_float32.json").read_text())
    assert {(r["runner"], r["sequences"]) for r in report["rows"]} == {("current", 1), ("current", 3)}
    assert all(r["steps"] == 2 and r["step_ms"] > 0 and set(r["phases_ms"]) == set(bench_decode.PHASES)
               and r["longest_row"] > 100 and len(r["tokens"]) == r["sequences"] for r in report["rows"])
    assert set(report["ratio_most_vs_fewest"]) == {"current: 3 vs 1"}
    assert all(len(p["top_ops"]) == 5 for size in report["profiles"].values() for p in size)
    # each profile's chrome trace beside the report; on the CPU no device time
    for n, (profile,) in report["profiles"].items():
        assert profile["trace"] == f"trace_float32_current_{n}.json"
        events = json.loads((tmp_path / profile["trace"]).read_text())["traceEvents"]
        assert any(e.get("name", "").startswith("aten::") for e in events)
        assert all(op["device_ms_per_step"] == 0 and op["self_ms_per_step"] >= 0 for op in profile["top_ops"])


def test_bench_decode_refuses_more_steps_than_an_answer_has():
    from profiling import bench_decode
    # Warm-up, the timed steps and the products' step, within one answer's new tokens.
    assert bench_decode.parse_args(["--repeat", str(bench_decode.spec.MAX_NEW_TOKENS - 3)]).repeat == 125
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--repeat", str(bench_decode.spec.MAX_NEW_TOKENS - 2)])
    assert bench_decode.parse_args(["--sequences", "16,1,16"]).sequences == [1, 16]


@pytest.mark.slow  # main() builds the arithmetic probes with g++
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("tool_commit")
def test_baselines_are_timed_beside_the_current_kernels_and_the_same_bits_choose_the_same_tokens(
        tmp_path, model_source, monkeypatch):
    from profiling import bench_decode
    for name, value in {**TEST_ENV, "GENERATE_PRECISION": "int8-dynamic"}.items():
        monkeypatch.setenv(name, value)
    baselines = ("fbgemm-int8", "unfused-int8", "chunked-attention")
    assert bench_decode.main(["--sequences", "1,3", "--repeat", "2", "--baselines", ",".join(baselines),
                              "--bandwidth-mib", "16", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_decode_int8-dynamic.json").read_text())
    assert report["settings"]["precision"] == "int8-dynamic"
    assert report["settings"]["baselines"] == list(baselines)
    runners = [bench_decode.CURRENT] + [f"{bench_decode.CURRENT} {b}" for b in baselines]
    assert {(r["runner"], r["sequences"]) for r in report["rows"]} == {(runner, n) for runner in runners for n in (1, 3)}
    assert all(r["steps"] == 2 and r["step_ms"] > 0 for r in report["rows"])
    # fbgemm, its glue fused or not, gives the current kernel's bits (where the kernels are built; otherwise
    # every runner multiplies alike)
    assert report["same_tokens_across_runners"] == {"1": True, "3": True}
    tokens = {(r["runner"], r["sequences"]): r["tokens"] for r in report["rows"]}
    assert all(tokens[(runner, n)] == tokens[(runners[0], n)] for runner in runners[1:3] for n in (1, 3))


def test_bench_decode_refuses_an_unknown_baseline():
    from profiling import bench_decode
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--baselines", "unfused-int8,fast-attention"])


def test_a_baseline_switches_its_kernels_within_and_restores_them_after_an_error_too():
    import torch

    from pipeline.kernels.fbgemm import fbgemm_is_exact
    from pipeline.kernels.int8 import Int8DynamicLinear, auto_kernel
    from pipeline.kernels.ordered_attention import EXTENSION
    from profiling.lib.kernel_baselines import running
    model = torch.nn.Sequential(Int8DynamicLinear(torch.nn.Linear(16, 8)), torch.nn.Linear(8, 4),
                                Int8DynamicLinear(torch.nn.Linear(4, 4)))
    int8 = [m for m in model if isinstance(m, Int8DynamicLinear)]
    built = EXTENSION.ops()
    x = torch.randn(3, 16)
    current = model(x)
    fbgemm = "fbgemm" if fbgemm_is_exact() else "int_mm"  # where fbgemm is not exact, the next kernel runs
    for baseline, fused in (("fbgemm-int8", True), ("unfused-int8", False)):
        with running(model, baseline):
            assert [(m.kernel, m.fused) for m in int8] == [(fbgemm, fused)] * 2
            assert not hasattr(model[1], "fused")
            assert torch.equal(model(x), current)  # every kernel, glue fused or not: the same bits
        assert [(m.kernel, m.fused) for m in int8] == [(auto_kernel(), True)] * 2
    from pipeline.kernels.avx2_int4 import EXTENSION as AVX2_INT4
    from pipeline.kernels.avx2_int8 import EXTENSION as AVX2
    from pipeline.kernels.int4 import Int4DynamicLinear
    quantized = torch.nn.Sequential(model, torch.nn.Linear(4, 32), Int4DynamicLinear(torch.nn.Linear(32, 64)))
    int4_before, current4 = quantized[2].kernel, quantized(x)
    with running(quantized, "avx2-kernels"):
        assert [m.kernel for m in int8] == ["avx2" if AVX2.ops() is not None else "int_mm"] * 2
        assert quantized[2].kernel == ("avx2" if AVX2_INT4.ops() is not None else "torch")
        assert torch.equal(quantized(x), current4)
    assert [m.kernel for m in int8] == [auto_kernel()] * 2 and quantized[2].kernel == int4_before
    with pytest.raises(KeyError), running(model, "chunked-attention"):
        assert EXTENSION.ops() is None  # the attention runs the flash chunks
        raise KeyError("a failing step")
    assert EXTENSION.ops() is built
    from pipeline.kernels.decode_glue import EXTENSION as GLUE
    glue = GLUE.ops()
    with pytest.raises(KeyError), running(model, "torch-glue"):
        assert GLUE.ops() is None and EXTENSION.ops() is built  # the decode step runs the torch ops
        raise KeyError("a failing step")
    assert GLUE.ops() is glue
    from pipeline.kernels.decode_layers import EXTENSION as LAYERS
    layers = LAYERS.ops()
    with pytest.raises(KeyError), running(model, "python-layers"):
        assert LAYERS.ops() is None and GLUE.ops() is glue  # the decode step loops its layers in Python
        raise KeyError("a failing step")
    assert LAYERS.ops() is layers
    from pipeline.kernels.greedy_choice import EXTENSION as GREEDY
    greedy = GREEDY.ops()
    with pytest.raises(KeyError), running(model, "torch-token-choice"):
        assert GREEDY.ops() is None and LAYERS.ops() is layers  # the chooser runs the torch ops
        raise KeyError("a failing step")
    assert GREEDY.ops() is greedy
    with pytest.raises(ValueError, match="unknown baseline"), running(model, "fast-attention"):
        pass


def test_the_small_pages_baseline_moves_each_large_weight_into_torchs_allocation_and_back():
    import torch

    from pipeline.kernels import huge_pages
    from pipeline.kernels.int8 import Int8DynamicLinear
    from profiling.lib.kernel_baselines import running
    big = torch.nn.Linear(1024, 1024)  # 4 MB of float32: a copy; its 4 KB bias stays
    quantized = Int8DynamicLinear(torch.nn.Linear(1024, 4096))  # its packed copy, where packed, 4 MB
    model = torch.nn.Sequential(big, torch.nn.ReLU(), quantized)
    big.weight.data = huge_pages.contiguous(big.weight.data)
    large = [big.weight, *[t for t in (quantized.kernel_parts() or ()) if t.nbytes >= huge_pages.HUGE_PAGE]]
    own = [t.data_ptr() for t in large]
    small_bias, x = big.bias.data_ptr(), torch.randn(3, 1024)
    current = model(x)
    for _ in range(2):  # the copies are made once and kept
        with pytest.raises(KeyError), running(model, "small-pages"):
            moved = [t.data_ptr() for t in large]
            assert all(m != o for m, o in zip(moved, own)) and big.bias.data_ptr() == small_bias
            assert torch.equal(model(x), current)
            raise KeyError("a failing step")
        assert [t.data_ptr() for t in large] == own
    with running(model, "small-pages"):
        assert [t.data_ptr() for t in large] == moved


@pytest.mark.slow  # main() builds the arithmetic probes with g++
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("tool_commit")
def test_each_precisions_steps_are_printed_against_the_memory_floor(tmp_path, model_source, monkeypatch, capsys):
    from profiling import bench_decode
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_decode.main(["--sequences", "1,2", "--repeat", "2", "--precisions", "float32,int4-weight,int8-dynamic",
                              "--bandwidth-mib", "16", "--out", str(tmp_path)]) == 0
    floors = json.loads((tmp_path / "bench_decode_floor.json").read_text())
    assert {(r["precision"], r["sequences"]) for r in floors["rows"]} == {
        (p, n) for p in ("float32", "int4-weight", "int8-dynamic") for n in (1, 2)}
    assert set(floors["bandwidth_gb_s"]) >= {"1"} and all(v > 0 for v in floors["bandwidth_gb_s"].values())
    weights = {r["precision"]: r["weight_mb"] for r in floors["rows"]}
    assert weights["int4-weight"] < 0.3 * weights["float32"]  # 4-bit codes against float32's 32 bits, and scales
    import torch
    for row in floors["rows"]:
        # the floor's bandwidth: the fastest of the probe before the steps and the reads between their rounds
        assert row["floor_gb_s"] >= floors["bandwidth_gb_s"][str(torch.get_num_threads())] - 0.01
        assert 0 < row["median_gb_s"] <= row["floor_gb_s"] and row["step_over_median_floor"] == pytest.approx(
            row["step_over_floor"] * row["median_gb_s"] / row["floor_gb_s"], rel=0.02)
        assert row["floor_ms"] > 0 and row["step_over_floor"] == pytest.approx(row["step_ms"] / row["floor_ms"], rel=0.02)
        # The products' floor is the weights' alone, under the step's (which adds the KV cache); the rest is
        # the step less its products (timed apart, so its sign is not asserted).
        assert 0 < row["weights_floor_ms"] < row["floor_ms"] and row["products_ms"] > 0
        assert row["products_over_floor"] == pytest.approx(row["products_ms"] / row["weights_floor_ms"], rel=0.02)
        assert row["outside_ms"] == pytest.approx(row["step_ms"] - row["products_ms"], abs=0.02)
    two = {r["precision"]: r for r in floors["rows"] if r["sequences"] == 2}
    one = {r["precision"]: r for r in floors["rows"] if r["sequences"] == 1}
    assert all(two[p]["kv_mb"] > one[p]["kv_mb"] for p in two)  # two sequences' caches against one's
    assert (tmp_path / "bench_decode_int4-weight.json").is_file() and (tmp_path / "bench_decode_float32.json").is_file()
    assert "against its memory floor" in capsys.readouterr().out
    # The arithmetic floor where every product runs one of the project's kernels (int8-dynamic's, whose
    # instruction every x86-64 CPU here has: VNNI's or AVX2's), none where torch's or oneDNN's run.
    from profiling.lib.arithmetic_peaks import PRODUCT_INSTRUCTIONS
    for row in floors["rows"]:
        assert row["product_macs"] and all(count > 0 for count in row["product_macs"].values())
        ours = set(row["product_macs"]) <= set(PRODUCT_INSTRUCTIONS)
        assert ours is (row["arithmetic_floor_ms"] is not None) and ours is (row["precision"] == "int8-dynamic")
        if ours:
            rate = {op: floors["mac_rates_gmac_s"][op] * 1e9 for op in row["product_macs"]}
            assert row["arithmetic_floor_ms"] == pytest.approx(
                1e3 * sum(n / rate[op] for op, n in row["product_macs"].items()), rel=0.02)
            assert row["step_over_bound"] == pytest.approx(
                row["step_ms"] / max(row["floor_ms"], row["arithmetic_floor_ms"]), rel=0.02)
    # a step of two rows makes twice the multiply-adds of one
    assert sum(two["int8-dynamic"]["product_macs"].values()) == 2 * sum(one["int8-dynamic"]["product_macs"].values())


def test_an_unknown_precision_is_refused():
    from profiling import bench_decode
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--precisions", "int3"])
