"""Rows of activations that exercise a per-row int8 quantizer's edges (pipeline.kernels.fused_int8's arithmetic)."""
from __future__ import annotations

import torch


def quiet_and_loud_rows(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """(n, k) float32 rows from 1e-6 to 1e6 in scale; from three rows on, an all-zero row (the 1e-12 scale
    floor) and a row with exact halves of its scale (round half to even)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * torch.logspace(-6, 6, max(n, 1))[:n, None]
    if n > 2:
        x[1] = 0
        x[2, ::3] = 0.5 * x[2].abs().amax() / 127
    return x
