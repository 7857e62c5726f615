"""oneDNN held below AMX on a CPU that has it: the hold, what the flag tests answer under it, and the
refusal of a hold that lets AMX run."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.config import ConfigError
from pipeline.cpu_features import (
    ROW_INVARIANT_ONEDNN_ISA,
    cpu_flags,
    cpu_supports_bf16,
    hold_onednn_below_amx,
    onednn_flags,
    onednn_isa_problem,
    onednn_isas_here,
)

AVX2 = {"sse4_1", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
EPYC_BF16 = AVX512 | {"avx512_bf16"}
XEON_AMX = EPYC_BF16 | {"avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}


def test_a_cpu_with_amx_is_held_at_the_row_invariant_level_unless_the_environment_holds_it():
    env: dict[str, str] = {}
    hold_onednn_below_amx(env, XEON_AMX)
    assert env == {"ONEDNN_MAX_CPU_ISA": ROW_INVARIANT_ONEDNN_ISA}
    for flags in (EPYC_BF16, AVX512, AVX2):
        env = {}
        hold_onednn_below_amx(env, flags)
        assert env == {}, flags  # nothing to hold: no AMX kernel can run
    for variable in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        env = {variable: "AVX2"}
        hold_onednn_below_amx(env, XEON_AMX)
        assert env == {variable: "AVX2"}  # the operator's own hold is kept


def test_the_flags_under_a_hold_are_the_cpus_less_the_levels_above_it():
    assert onednn_flags(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == EPYC_BF16
    assert onednn_flags(XEON_AMX, {"DNNL_MAX_CPU_ISA": "avx2"}) == AVX2  # any case, either variable
    assert onednn_flags(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}) == AVX512 - {"avx512_vnni"}
    assert onednn_flags(XEON_AMX, {}) == XEON_AMX
    assert onednn_flags(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "NO_SUCH_LEVEL"}) == XEON_AMX  # oneDNN ignores it too
    # ONEDNN_ is read before DNNL_, as oneDNN reads them
    assert onednn_flags(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == AVX2


def test_a_hold_that_lets_amx_run_is_named_with_its_value_and_the_level_to_use():
    assert onednn_isa_problem({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, XEON_AMX) is None
    assert onednn_isa_problem({"DNNL_MAX_CPU_ISA": "AVX2"}, XEON_AMX) is None
    for flags in (EPYC_BF16, AVX2):
        assert onednn_isa_problem({}, flags) is None
        assert onednn_isa_problem({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, flags) is None  # no AMX to run
    unset = onednn_isa_problem({}, XEON_AMX)
    assert unset and "ONEDNN_MAX_CPU_ISA is not set" in unset and ROW_INVARIANT_ONEDNN_ISA in unset
    amx = onednn_isa_problem({"ONEDNN_MAX_CPU_ISA": "AVX10_1_512_AMX"}, XEON_AMX)
    assert amx and amx.startswith("ONEDNN_MAX_CPU_ISA=AVX10_1_512_AMX lets oneDNN run AMX")
    typo = onednn_isa_problem({"DNNL_MAX_CPU_ISA": "AVX512_CORE_BF61"}, XEON_AMX)
    assert typo and typo.startswith("DNNL_MAX_CPU_ISA=AVX512_CORE_BF61 names no oneDNN level")
    fp16 = onednn_isa_problem({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"}, XEON_AMX)
    assert fp16 and ROW_INVARIANT_ONEDNN_ISA in fp16  # above the level the invariance was checked at


def test_loading_a_model_where_amx_may_run_is_a_startup_error_naming_the_variable(monkeypatch):
    from pipeline import cpu_features
    from pipeline.kernels.versions import check_kernel_versions
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(XEON_AMX))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX lets oneDNN run AMX"):
        check_kernel_versions("cpu")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", ROW_INVARIANT_ONEDNN_ISA)
    check_kernel_versions("cpu")


def test_the_levels_checked_here_are_those_the_cpu_has():
    assert onednn_isas_here(XEON_AMX) == ["AVX2", "AVX512_CORE", "AVX512_CORE_BF16"]
    assert onednn_isas_here(EPYC_BF16) == ["AVX2", "AVX512_CORE", "AVX512_CORE_BF16"]
    assert onednn_isas_here(AVX512) == ["AVX2", "AVX512_CORE"]
    assert onednn_isas_here(AVX2) == ["AVX2"]
    assert onednn_isas_here(set()) == []


@pytest.mark.slow
@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this CPU has no avx512_bf16 to hold below")
def test_a_process_held_below_bf16_is_offered_float32_and_its_onednn_refuses_bfloat16():
    """The hold is what oneDNN runs: held at AVX2, this process's flag test says no bf16, PRECISION=auto
    gives float32, and oneDNN itself refuses a bfloat16 product (it would be emulated)."""
    assert cpu_supports_bf16()
    probe = ("import pipeline, torch\n"
             "from pipeline.cpu_features import cpu_supports_bf16\n"
             "from pipeline.config import Settings\n"
             "from pipeline.device import placement_for\n"
             "print(cpu_supports_bf16(), placement_for(Settings.from_env({}), 'embed').precision)\n"
             "try:\n"
             "    torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8).bfloat16(), 8); print('ran')\n"
             "except RuntimeError:\n"
             "    print('refused')\n")
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    held = subprocess.run([sys.executable, "-c", probe], env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"},
                          capture_output=True, text=True, timeout=120)
    assert held.stdout.split() == ["False", "float32", "refused"], held.stderr[-2000:]
    free = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert free.stdout.split() == ["True", "bfloat16", "ran"], free.stderr[-2000:]


def test_the_level_this_process_runs_at_is_the_holds_else_the_cpus_highest_checked_one():
    from pipeline.cpu_features import onednn_checked_level
    assert onednn_checked_level(EPYC_BF16, {}) == "AVX512_CORE_BF16"
    assert onednn_checked_level(AVX2, {}) == "AVX2"
    assert onednn_checked_level(XEON_AMX, {}) is None  # unheld, AMX: above every checked level
    assert onednn_checked_level(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}) == "AVX512_CORE_BF16"
    assert onednn_checked_level(XEON_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}) is None
