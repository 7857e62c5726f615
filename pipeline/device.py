"""Where models run and in which dtype, decided once from settings and hardware.

bfloat16 pays off on CPUs with avx512_bf16 or AMX (about twice float32 here);
float16 on a CPU is several times slower than float32, so it is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from pipeline.config import ConfigError, Settings
from pipeline.cpu_features import cpu_has_amx, cpu_supports_bf16


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def select_device(only_cpu: bool, cuda_available: Callable[[], bool] = _cuda_available) -> str:
    return "cpu" if only_cpu or not cuda_available() else "cuda"


def select_dtype(device: str, requested: str, *, variable: str = "DTYPE",
                 bf16_cpu: Callable[[], bool] = cpu_supports_bf16,
                 bf16_cuda: Callable[[], bool] | None = None) -> str:
    """Resolve 'auto' and refuse float16 on the CPU (slow there, see MEASUREMENTS)."""
    if device == "cpu":
        if requested == "float16":
            raise ConfigError(f"{variable}='float16' is not valid on the CPU: expected auto, float32 or bfloat16")
        if requested == "auto":
            return "bfloat16" if bf16_cpu() else "float32"
        return requested
    if requested == "auto":
        if bf16_cuda is None:
            import torch
            bf16_cuda = torch.cuda.is_bf16_supported
        return "bfloat16" if bf16_cuda() else "float16"
    return requested


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: str  # what the model is loaded in
    precision: str = "float32"  # its variant (pipeline/precision.py); the dtype itself for exact

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)


def placement_for(settings: Settings, stage: str, **detectors) -> Placement:
    """Device, dtype and precision variant of one model stage, resolved once (faked detectors in tests)."""
    from pipeline import precision  # imports torch: only where a model is about to be placed
    device = select_device(settings.models.only_cpu, **{k: v for k, v in detectors.items() if k == "cuda_available"})
    dtype_detectors = {k: v for k, v in detectors.items() if k in ("bf16_cpu", "bf16_cuda")}
    variant = precision.resolve_variant(
        settings.stage_precision(stage), stage, device, settings.stage_precision_variable(stage),
        bf16_cpu=detectors.get("bf16_cpu", cpu_supports_bf16), amx_cpu=detectors.get("amx_cpu", cpu_has_amx),
        **{k: v for k, v in detectors.items() if k in ("cuda_int8", "cuda_bf16")})
    if variant is None:  # exact: the dtype settings decide, as before precision variants existed
        dtype = select_dtype(device, settings.stage_dtype(stage), variable=settings.stage_dtype_variable(stage),
                             **dtype_detectors)
        return Placement(device, dtype, dtype)
    return Placement(device, precision.LOAD_DTYPE[variant], variant)


def thread_budget(requested: int, cores: int | None = None) -> int:
    """0 means 'the machine's cores' (what this process may use, not the host's)."""
    if requested > 0:
        return requested
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
    return max(1, cores)
