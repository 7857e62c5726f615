"""fbgemm's dynamic int8 linear made exact: int8 x int8 -> int32 sums bit-identical to `torch._int_mm`'s."""
from __future__ import annotations

import functools
import warnings

import torch

from pipeline.kernels.exact_check import sums_int8_exactly


class AnchoredFbgemm:
    """int8 x int8 -> int32 sums through fbgemm, bit-identical to `torch._int_mm`'s.

    fbgemm's dynamic linear is about 1.4-1.9x faster than `_int_mm` at decode's 1-16 rows
    (docs/performance.md) but picks one activation scale for the whole input, which
    would let a batch-mate change a row's result. Our rows arrive already quantized per row
    (integers in -127..127); one extra anchor row holding -128 and 127 pins fbgemm's range to
    exactly [-128, 127], so its scale is exactly 1 and its zero point 128: it adds nothing and
    rounds nothing, and returns sum(codes x weight) x channel scale, each row on its own."""

    def __init__(self, qweight, weight_scale):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch, still shipped (2.13)
            weight = torch._make_per_channel_quantized_tensor(
                qweight, weight_scale.double(), torch.zeros(qweight.shape[0], dtype=torch.long), axis=0)
            # No bias: the caller adds its float32 bias after the row scale.
            self.packed = torch.ops.quantized.linear_prepack(weight, B=None)
        self.anchor = torch.zeros(1, qweight.shape[1])
        self.anchor[0, 0], self.anchor[0, 1] = -128.0, 127.0

    def sums(self, codes):
        """codes: (rows, in) float integers -> (rows, out) float32 int32-sums x channel scale."""
        return self.anchored_sums(torch.cat([self.anchor, codes]))[1:]

    def anchored_sums(self, anchored):
        """:meth:`sums` of codes that already follow the anchor row: (1 + rows, in) -> (1 + rows, out),
        the anchor's own row first."""
        # reduce_range=True would quantize to 7 bits: the anchor's scale would no longer be 1.
        return torch.ops.quantized.linear_dynamic(anchored, self.packed, reduce_range=False)

    def unpacked(self):
        """The (out, in) int8 weight, unpacked from fbgemm's copy."""
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()


@functools.cache
def fbgemm_is_exact() -> bool:
    """Whether this CPU's fbgemm sums int8 exactly (checked once, on the worst case: without
    VNNI its 16-bit pair sums saturate at full-range codes), so the anchored path may be used."""
    return sums_int8_exactly(lambda qweight, scale, codes: AnchoredFbgemm(qweight, scale).sums(codes.float()))
