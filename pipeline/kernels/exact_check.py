"""The case an int8 kernel must get exactly right before int8-dynamic may multiply with it."""
from __future__ import annotations

import torch


def full_range_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 weight, channel scales, int8 codes, the exact float32 sums x scale): full-range codes of
    alternating sign, the worst case for any 16-bit intermediate (without VNNI the pair sums of
    fbgemm and of oneDNN's `torch._int_mm` saturate there), and a scale that is not a power of two,
    so the rounding must agree too. The sums are integer arithmetic's (float64 holds them exactly),
    not any int8 kernel's."""
    qweight = torch.full((24, 64), 127, dtype=torch.int8)
    qweight[1::2] = -127
    scale = torch.full((24,), 0.0123)
    codes = torch.full((5, 64), 127, dtype=torch.int8)
    codes[1::2] = -127
    sums = (codes.double() @ qweight.double().t()).float()  # at most 64 x 127 x 127: exact in float32 too
    return qweight, scale, codes, sums * scale
