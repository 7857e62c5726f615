"""Device and dtype selection, with hardware detection faked."""
import pytest

from pipeline.config import ConfigError, Settings
from pipeline.cpu_features import cpu_has_amx, cpu_has_amx_int8, cpu_supports_bf16
from pipeline.device import placement_for, select_device, select_dtype, thread_budget


def test_cuda_used_when_present_unless_only_cpu():
    assert select_device(False, cuda_available=lambda: True) == "cuda"
    assert select_device(True, cuda_available=lambda: True) == "cpu"
    assert select_device(False, cuda_available=lambda: False) == "cpu"


def test_auto_dtype_on_cpu_follows_bf16_flags():
    assert select_dtype("cpu", "auto", bf16_cpu=lambda: True) == "bfloat16"
    assert select_dtype("cpu", "auto", bf16_cpu=lambda: False) == "float32"
    assert cpu_supports_bf16({"avx2", "avx512_bf16"}) and cpu_supports_bf16({"amx_bf16"})
    assert not cpu_supports_bf16({"avx2", "avx512f"})
    assert cpu_has_amx({"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
    assert not cpu_has_amx({"avx512_bf16"}) and not cpu_has_amx({"amx_int8", "amx_tile"})
    assert cpu_has_amx_int8({"amx_int8", "amx_tile"}) and not cpu_has_amx_int8({"amx_bf16", "amx_tile"})


def test_never_float16_on_cpu():
    with pytest.raises(ConfigError, match="GENERATE_DTYPE='float16'"):
        select_dtype("cpu", "float16", variable="GENERATE_DTYPE")


def test_cuda_dtypes():
    assert select_dtype("cuda", "auto", bf16_cuda=lambda: True) == "bfloat16"
    assert select_dtype("cuda", "auto", bf16_cuda=lambda: False) == "float16"
    assert select_dtype("cuda", "float16") == "float16"


def test_per_stage_override():
    s = Settings.from_env({"DTYPE": "auto", "RERANK_DTYPE": "float32"})
    p = placement_for(s, "rerank", cuda_available=lambda: False, bf16_cpu=lambda: True)
    assert (p.device, p.dtype) == ("cpu", "float32")
    assert p.precision == "float32"  # exact (the default PRECISION): the variant is the dtype itself
    p = placement_for(s, "generate", cuda_available=lambda: False, bf16_cpu=lambda: True)
    assert (p.device, p.dtype) == ("cpu", "bfloat16")
    p = placement_for(Settings.from_env({"DTYPE": "auto", "RERANK_DTYPE": "float32", "ONLY_CPU": "false"}), "generate", cuda_available=lambda: True,
                      bf16_cpu=lambda: True, bf16_cuda=lambda: False)
    assert (p.device, p.dtype) == ("cuda", "float16")


def test_thread_budget():
    assert thread_budget(3, cores=16) == 3
    assert thread_budget(0, cores=2) == 2
    assert thread_budget(0) >= 1
