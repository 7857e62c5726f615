"""oneDNN's int8 linear as an exact int8 x int8 -> int32 product: sums bit-identical to `torch._int_mm`'s.

On a CPU with AMX (amx_int8) oneDNN multiplies int8 on the matrix tiles with the weight packed
once, and its time hardly grows from 1 to 16 rows (decode) where fbgemm's does: per Linear of
the LLM 0.35 against 0.47 ms at 16 rows, 2.3 against 5.1 ms at a 256-token prompt, the
vocabulary head 15 against 25 ms at 16 rows (docs/performance.md). It is given our
per-row int8 codes with an activation scale of exactly 1 and zero point 0, so it rounds nothing
but its int32 -> float32 conversion and the channel scale, as `_int_mm` then a multiply does.
"""
from __future__ import annotations

import functools

import torch

from pipeline.cpu_features import cpu_has_amx_int8
from pipeline.kernels.exact_check import full_range_case

# oneDNN (torch 2.13, AMX Xeon) takes a path about 100x slower for products of at most 256 outputs
# (rows x out features: one row of the LLM's 128-wide k/v projections took 3.2 ms, three rows
# 0.03 ms); zero rows are added up to this many outputs.
MIN_OUTPUTS = 512


class PackedOnednn:
    """An (out, in) int8 weight packed for oneDNN, multiplied by int8 codes scaled 1."""

    def __init__(self, qweight, weight_scale):
        self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
        self.weight_scale = weight_scale.float().reshape(-1).contiguous()
        self.zero_points = torch.zeros(qweight.shape[0], dtype=torch.int32)
        self.shape = tuple(qweight.shape)

    def sums(self, codes):
        """codes: (rows, in) int8 -> (rows, out) float32 int32-sums x channel scale."""
        rows = codes.shape[0]
        short = -(-MIN_OUTPUTS // self.shape[0]) - rows  # zero rows to add: each row's sums are its own
        if short > 0:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, short))
        # No bias: the caller adds its float32 bias after the row scale.
        return torch.ops.onednn.qlinear_pointwise(codes, 1.0, 0, self.packed, self.weight_scale, self.zero_points,
                                                  None, 1.0, 0, torch.float32, "none", [], "")[:rows]

    def nbytes(self) -> int:
        """The packed weight's bytes: one per weight (oneDNN pads to its blocks; not counted)."""
        return self.shape[0] * self.shape[1]


@functools.cache
def onednn_int8_is_used() -> bool:
    """Whether this CPU multiplies int8 through oneDNN: it has AMX int8 tiles (measured faster than
    fbgemm there; elsewhere fbgemm stays) and oneDNN sums exactly, checked once on full-range codes
    (the worst case for any 16-bit intermediate) against `torch._int_mm`."""
    if not cpu_has_amx_int8() or not torch.backends.mkldnn.is_available():
        return False
    try:
        qweight, scale, codes, expected = full_range_case()
        return torch.equal(PackedOnednn(qweight, scale).sums(codes), expected)
    except (RuntimeError, AttributeError):  # a torch built without oneDNN's quantized ops
        return False
