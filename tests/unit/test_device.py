"""Device and precision selection, with hardware detection faked."""
import pytest

from pipeline.config import ConfigError, Settings
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.device import describe_placement, placement_for, select_device, thread_budget

CPU = {"cuda_available": lambda: False}


def test_cuda_used_when_present_unless_only_cpu():
    assert select_device(False, cuda_available=lambda: True) == "cuda"
    assert select_device(True, cuda_available=lambda: True) == "cpu"
    assert select_device(False, cuda_available=lambda: False) == "cpu"


def test_auto_precision_on_cpu_follows_bf16_flags():
    s = Settings.from_env({"PRECISION": "auto"})
    assert placement_for(s, "embed", bf16_cpu=lambda: True, **CPU).precision == "bfloat16"
    assert placement_for(s, "embed", bf16_cpu=lambda: False, **CPU).precision == "float32"
    assert cpu_supports_bf16({"avx2", "avx512_bf16"}) and cpu_supports_bf16({"amx_bf16"})
    assert not cpu_supports_bf16({"avx2", "avx512f"})


def test_never_float16_on_cpu():
    with pytest.raises(ConfigError, match="GENERATE_PRECISION='float16' is not valid on the CPU"):
        placement_for(Settings.from_env({"GENERATE_PRECISION": "float16"}), "generate", bf16_cpu=lambda: True, **CPU)


def test_cuda_precisions():
    gpu = {"cuda_available": lambda: True, "bf16_cpu": lambda: True}
    auto = Settings.from_env({"PRECISION": "auto"})
    assert placement_for(auto, "embed", cuda_bf16=lambda: True, **gpu).precision == "bfloat16"
    assert placement_for(auto, "embed", cuda_bf16=lambda: False, **gpu).precision == "float16"
    p = placement_for(Settings.from_env({"PRECISION": "float16"}), "embed", cuda_bf16=lambda: True, **gpu)
    assert (p.device, p.dtype, p.precision) == ("cuda", "float16", "float16")


def test_per_stage_override():
    s = Settings.from_env({"PRECISION": "auto", "RERANK_PRECISION": "float32"})
    p = placement_for(s, "rerank", bf16_cpu=lambda: True, **CPU)
    assert (p.device, p.dtype, p.precision) == ("cpu", "float32", "float32")
    p = placement_for(s, "generate", bf16_cpu=lambda: True, **CPU)
    assert (p.device, p.dtype) == ("cpu", "bfloat16")


def test_the_resolved_precision_is_described_with_its_variable_and_the_hardware():
    s = Settings.from_env({"PRECISION": "auto", "RERANK_PRECISION": "int8-dynamic"})
    bf16 = {"bf16_cpu": lambda: True, **CPU}
    assert describe_placement(s, "embed", **bf16) == "embed: bfloat16 (PRECISION=auto on a CPU with avx512_bf16 (or AMX, held below it))"
    assert (describe_placement(s, "embed", bf16_cpu=lambda: False, **CPU)
            == "embed: float32 (PRECISION=auto on a CPU without avx512_bf16 or AMX)")
    assert describe_placement(s, "rerank", **bf16).startswith("rerank: int8-dynamic (RERANK_PRECISION=int8-dynamic on ")


def test_thread_budget():
    assert thread_budget(3, cores=16) == 3
    assert thread_budget(0, cores=2) == 2
    assert thread_budget(0) >= 1
