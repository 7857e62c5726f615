"""The case a packed int8 kernel must get exactly right before it may stand in for `torch._int_mm`."""
from __future__ import annotations

import torch


def full_range_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 weight, channel scales, int8 codes, the exact float32 sums x scale): full-range codes of
    alternating sign, the worst case for any 16-bit intermediate (without VNNI fbgemm's pair sums
    saturate there), and a scale that is not a power of two, so the rounding must agree too."""
    qweight = torch.full((24, 64), 127, dtype=torch.int8)
    qweight[1::2] = -127
    scale = torch.full((24,), 0.0123)
    codes = torch.full((5, 64), 127, dtype=torch.int8)
    codes[1::2] = -127
    return qweight, scale, codes, torch._int_mm(codes, qweight.t()).float() * scale
