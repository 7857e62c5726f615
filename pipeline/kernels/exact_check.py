"""The cases a packed kernel must get exactly right before a variant may multiply with it."""
from __future__ import annotations

from typing import Callable

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


def sums_int8_exactly(product: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Whether `product(int8 weight, channel scales, int8 codes)` -> float32 sums x scale gives
    :func:`full_range_case`'s exact result (False where it raises: a torch without the op)."""
    try:
        qweight, scale, codes, expected = full_range_case()
        return torch.equal(product(qweight, scale, codes), expected)
    except (RuntimeError, AttributeError):
        return False


def int4_case() -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """(int32 codes 0..15 (80, 64), bfloat16 [scale, offset] per group (2, 80, 2), the group width 32,
    bfloat16 rows (5, 64), their exact product rounded once to bfloat16) for weights read as
    (code - 8) x scale + offset. Scales 1 or 2 and integer offsets, rows of -1, 0 and 1: every product
    and sum is an integer float32 holds exactly, so only a kernel reading the packing otherwise (another
    offset, code order, group or column layout) gives other bits. 80 columns: one 64-wide tile and a
    16-wide one; 5 rows: a 4-row block and a lone row."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (80, 64), dtype=torch.int32, generator=generator)
    scale = torch.randint(1, 3, (2, 80), generator=generator).float()
    offset = torch.randint(-4, 5, (2, 80), generator=generator).float()
    params = torch.stack([scale, offset], dim=2).to(torch.bfloat16)
    per_column = [t.t().double().repeat_interleave(32, dim=1) for t in (scale, offset)]  # (80, 64) each
    weight = (codes.double() - 8) * per_column[0] + per_column[1]
    rows = torch.randint(-1, 2, (5, 64), generator=generator).double()
    return codes, params, 32, rows.to(torch.bfloat16), (rows @ weight.t()).to(torch.bfloat16)
