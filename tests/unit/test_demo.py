"""tools/demo.py: the line it prints about PRECISION=fast, and the machine kind it names."""
from __future__ import annotations

from pipeline.config import Settings
from tools.demo import machine_kind, precision_hint

AMX_XEON = {"avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}
BF16_EPYC = {"avx2", "avx512f", "avx512_bf16"}
PLAIN = {"avx2", "fma"}


def hint(flags, env=None, cuda=lambda: False):
    return precision_hint(Settings.from_env(env or {}), cpu_flags=flags, cuda_available=cuda)


def test_the_machine_kind_follows_the_cpu_flags_it_is_given():
    assert machine_kind(False, AMX_XEON, lambda: False) == "cpu-bf16"  # held below AMX: pipeline.cpu_features
    assert machine_kind(False, BF16_EPYC, lambda: False) == "cpu-bf16"
    assert machine_kind(False, PLAIN, lambda: False) == "cpu"
    assert machine_kind(False, PLAIN, lambda: True) == "cuda"
    assert machine_kind(True, PLAIN, lambda: True) == "cpu"  # ONLY_CPU=true


def test_the_hint_names_what_fast_trades_and_no_figure_measured_with_kernels_the_service_does_not_run():
    for flags, words in ((AMX_XEON, "a CPU with avx512_bf16 (or AMX, held below it)"),
                         (BF16_EPYC, "a CPU with avx512_bf16 (or AMX, held below it)"),
                         (PLAIN, "a CPU without avx512_bf16 or AMX")):
        line = hint(flags)
        assert line is not None and line.startswith("PRECISION=fast (opt-in)") and "int8" in line
        assert "1.64" not in line and "Xeon" not in line and "f8683be" not in line
        assert f"was not measured on {words}" in line and line.endswith(f"This machine: {words}")


def test_no_hint_when_fast_is_on_or_on_a_gpu_where_fast_computes_what_the_default_does():
    assert hint(AMX_XEON, {"PRECISION": "fast"}) is None
    assert hint(PLAIN, cuda=lambda: True) is None
    assert hint(PLAIN, {"ONLY_CPU": "true"}, cuda=lambda: True) is not None
