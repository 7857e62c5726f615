"""Where models run and in which precision, decided once from settings and hardware
(the choice itself: pipeline/precision_policy.py).

bfloat16 pays off on CPUs with avx512_bf16 or AMX (about twice float32 here);
float16 on a CPU is several times slower than float32, so it is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from pipeline.config import Settings
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.precision_policy import HARDWARE_WORDS, LOAD_DTYPE, hardware_kind, resolve_variant


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def select_device(only_cpu: bool, cuda_available: Callable[[], bool] = _cuda_available) -> str:
    return "cpu" if only_cpu or not cuda_available() else "cuda"


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: str  # what the model is loaded in
    precision: str = "float32"  # its variant (pipeline/precision.py): what it computes in

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)


def placement_for(settings: Settings, stage: str, **detectors) -> Placement:
    """Device, dtype and precision variant of one model stage, resolved once (faked detectors in tests)."""
    device = select_device(settings.models.only_cpu, **{k: v for k, v in detectors.items() if k == "cuda_available"})
    variant = resolve_variant(
        settings.stage_precision(stage), stage, device, settings.stage_precision_variable(stage),
        bf16_cpu=detectors.get("bf16_cpu", cpu_supports_bf16),
        **{k: v for k, v in detectors.items() if k in ("cuda_bf16", "int8_cpu", "packs_bf16", "int4_cpu")})
    return Placement(device, LOAD_DTYPE[variant], variant)


def hardware_words(device: str, **detectors) -> str:
    """This machine's kind as the precision table knows it, in words ("a CUDA GPU")."""
    return HARDWARE_WORDS[hardware_kind(device, detectors.get("bf16_cpu", cpu_supports_bf16))]


def describe_placement(settings: Settings, stage: str, **detectors) -> str:
    """What a stage computes in and why, in one line, without loading a model:
    "embed: bfloat16 (PRECISION=auto on a CPU with avx512_bf16 (or AMX, held below it))"."""
    placement = placement_for(settings, stage, **detectors)
    variable = settings.stage_precision_variable(stage)
    where = hardware_words(placement.device, **detectors)
    return f"{stage}: {placement.precision} ({variable}={settings.stage_precision(stage)} on {where})"


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
