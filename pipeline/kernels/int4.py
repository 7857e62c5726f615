"""int4 Linears: group-wise 4-bit weights, with bfloat16 activations (int4-weight, torch's packed int4
product) or int8 activations quantized per row (int4-dynamic, pipeline.kernels.vnni_int4's product).

Each output row's weights are cut into groups of `group` input columns (128 where the width allows, else
64 or 32); a group keeps its own bfloat16 scale and offset (asymmetric, round to nearest: the group's
minimum to maximum in 16 steps), so a weight is (code - 8) x scale + offset, code in 0..15. About 0.53
bytes a weight against bfloat16's 2: a decode step reads a quarter of the bytes.

The product is `torch.ops.aten._weight_int4pack_mm_for_cpu` on the weight packed once by
`_convert_weight_to_int4pack_for_cpu` (its tinygemm kernel: AVX-512 or AVX2, a scalar loop elsewhere).
It computes each output element on its own, dequantizing as it goes and summing its row's products in
one float32 accumulator in input order, whatever the row count, the rows beside it and the thread
count (it splits work by tiles of rows and columns, never along a sum), so a row's bits never depend on
its batch-mates (tests/unit/test_int4_kernels.py: 1..64 rows and more, 1, 2 and 8 threads).

int4-dynamic (:class:`Int4DynamicLinear`) keeps the same codes, scales and offsets, but quantizes each row
of activations to int8 as int8-dynamic does and sums code x code exactly per group (VNNI): a decode step at a
few rows reads half of int8-dynamic's bytes without widening every weight to a float.

A Linear the kernel cannot take (its output width not a multiple of 16, its input width not one of 32:
a classifier's label head, a score head) becomes an int8 weight-only Linear instead
(:func:`int4_or_int8_weight`), row-invariant too. Conversion is refused (ConfigError) where the kernel
does not give :func:`int4_is_exact`'s case exactly.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from pipeline.config import ConfigError
from pipeline.kernels import avx2_int4, vnni_int4
from pipeline.kernels.exact_check import int4_case
from pipeline.kernels.int8 import Int8DynamicLinear, Int8WeightLinear

# The group widths tried, widest first (the kernel takes 32, 64, 128 and 256; 128 is AWQ's and GPTQ's).
GROUP_SIZES = (128, 64, 32)
# Output columns per kernel tile: the packed layout needs a multiple of this.
COLUMN_MULTIPLE = 16
# The packing's K-tile count: the CPU packing ignores it (one layout), the signature asks for it.
INNER_K_TILES = 8
# Rows quantized at a time at load: bounds the float copies (lm_head is 151936 x 896).
_QUANTIZE_ROWS = 8192


def group_width(in_features: int) -> int | None:
    """The widest of :data:`GROUP_SIZES` that divides `in_features` (int4-dynamic's group), None where none does."""
    return next((g for g in GROUP_SIZES if in_features % g == 0), None)


def int4_group(in_features: int, out_features: int) -> int | None:
    """The group width a Linear of this shape gets in int4-weight, None where torch's kernel cannot take it."""
    if out_features % COLUMN_MULTIPLE:
        return None
    return group_width(in_features)


def quantize_groups(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight -> (codes, scales_and_offsets): int32 codes 0..15 of the same shape, and
    (in / group, out, 2) bfloat16 [scale, offset] per group, as the kernel reads them. The codes are
    rounded against the bfloat16 scale and offset the kernel will use, not the float ones."""
    out_features, in_features = weight.shape
    codes = torch.empty(weight.shape, dtype=torch.int32)
    params = torch.empty(in_features // group, out_features, 2, dtype=torch.bfloat16)
    for start in range(0, out_features, _QUANTIZE_ROWS):
        rows = weight[start:start + _QUANTIZE_ROWS].float()
        groups = rows.reshape(rows.shape[0], -1, group)
        low, high = groups.amin(dim=2, keepdim=True), groups.amax(dim=2, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-6).to(torch.bfloat16).float()
        offset = (low + 8 * scale).to(torch.bfloat16).float()  # the weight at code 8
        q = ((groups - offset) / scale + 8).round().clamp(0, 15)
        codes[start:start + _QUANTIZE_ROWS] = q.reshape(rows.shape).to(torch.int32)
        params[:, start:start + _QUANTIZE_ROWS] = torch.cat([scale, offset], dim=2).transpose(0, 1).to(torch.bfloat16)
    return codes, params


def dequantize(codes: torch.Tensor, params: torch.Tensor, group: int) -> torch.Tensor:
    """The float32 (out, in) weight the kernel multiplies by: (code - 8) x scale + offset, per group."""
    out_features, in_features = codes.shape
    scale = params[..., 0].float().t().repeat_interleave(group, dim=1)
    offset = params[..., 1].float().t().repeat_interleave(group, dim=1)
    return (codes.float() - 8) * scale + offset


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int32 (out, in) codes -> the kernel's packed uint8 (out, in / 2)."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), INNER_K_TILES)


def packed_product(rows: torch.Tensor, packed: torch.Tensor, group: int, params: torch.Tensor) -> torch.Tensor:
    """(n, in) bfloat16 rows x the packed weight -> (n, out) bfloat16."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, group, params)


@functools.cache
def int4_is_exact() -> bool:
    """Whether this torch's int4 kernel reads the packing as :func:`dequantize` does (checked once, on a case
    whose every sum is exact in float32: a changed layout, offset or code order gives other numbers)."""
    try:
        codes, params, group, rows, expected = int4_case()
        return torch.equal(packed_product(rows, pack(codes), group, params), expected)
    except (RuntimeError, AttributeError):  # a torch without the op, or one with another signature
        return False


class Int4WeightLinear(torch.nn.Module):
    """Group-wise int4 weights, bfloat16 activations and bias (module docstring). CPU only."""

    packed: torch.Tensor  # registered buffers
    scales_and_offsets: torch.Tensor

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        group = int4_group(self.in_features, self.out_features)
        if group is None:
            raise ValueError(f"int4 needs out_features % {COLUMN_MULTIPLE} == 0 and in_features % "
                             f"{GROUP_SIZES[-1]} == 0, got {self.out_features} x {self.in_features}")
        if not int4_is_exact():
            raise ConfigError("int4-weight needs torch's packed int4 product "
                              "(aten._weight_int4pack_mm_for_cpu) as pipeline/kernels/int4.py reads it, and this "
                              "torch's differs or lacks it: choose bfloat16 or int8-weight for this stage")
        self.group = group
        codes, params = quantize_groups(linear.weight.detach(), group)
        self.register_buffer("packed", pack(codes))
        self.register_buffer("scales_and_offsets", params)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"bias={self.bias is not None}")

    def forward(self, x):
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        if rows.shape[0] == 0:
            out = rows.new_zeros((0, self.out_features))
        else:
            out = packed_product(rows, self.packed, self.group, self.scales_and_offsets)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def int4_or_int8_weight(linear: torch.nn.Linear) -> torch.nn.Module:
    """The int4-weight variant's Linear: int4 where the kernel takes the shape, else int8 weight-only."""
    if int4_group(linear.in_features, linear.out_features) is None:
        return Int8WeightLinear(linear)
    return Int4WeightLinear(linear)


class Int4DynamicLinear(torch.nn.Module):
    """Group-wise int4 weights (:func:`quantize_groups`'s codes, bfloat16 scales and offsets) x int8
    activations quantized per row, float32 in and out: pipeline.kernels.vnni_int4's arithmetic, by its
    AVX-512 VNNI kernel where built for this CPU, else by pipeline.kernels.avx2_int4's where built, else by
    :func:`~pipeline.kernels.vnni_int4.reference_product` (torch's ops); the same bits from each. CPU only."""

    KERNELS = ("vnni", "avx2", "torch")  # fastest first; the first this machine runs is taken
    _OPS = {"vnni": (vnni_int4.EXTENSION, "vnni_int4_linear"), "avx2": (avx2_int4.EXTENSION, "avx2_int4_linear")}

    packed: torch.Tensor  # registered buffers: vnni_int4.pack's pair, and the float32 bias or None
    params: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        group = group_width(self.in_features)
        if group is None:
            raise ValueError(f"int4-dynamic needs in_features % {GROUP_SIZES[-1]} == 0, "
                             f"got {self.in_features}")
        self.group = group
        codes, params = quantize_groups(linear.weight.detach(), group)
        scale, offset = (params[..., i].float().t().contiguous() for i in (0, 1))
        packed, kernel_params = vnni_int4.pack(codes, scale, offset)
        self.register_buffer("packed", packed)
        self.register_buffer("params", kernel_params)
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.register_buffer("bias", bias)
        # The kernel's op, or None for torch's ops, on the weight unpacked once, when first needed.
        self._kernel: Any = None
        self._unpacked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.kernel = self.use_kernel(self.KERNELS[0])

    def use_kernel(self, kernel: str) -> str:
        """Multiply with `kernel` (one of :data:`KERNELS`) from now on, or, where this machine cannot, with the next
        that it can (torch's ops always can); returns the kernel taken."""
        if kernel not in self.KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(self.KERNELS)}, got {kernel!r}")
        for name in self.KERNELS[self.KERNELS.index(kernel):]:  # the last, torch, runs anywhere
            op = self._OPS[name][0].registered(self._OPS[name][1]) if name in self._OPS else None
            if op is not None or name not in self._OPS:
                break
        self._kernel, self.kernel = op, name
        return name

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"bias={self.bias is not None}")

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, in) float32 rows, n >= 1 -> (n, out) float32, without forward's reshapes and casts."""
        parts = self.kernel_parts()
        if parts is not None:
            packed, params, bias = parts
            return self._kernel(rows, packed, params, self.out_features, bias)
        if self._unpacked is None:
            self._unpacked = vnni_int4.unpack(self.packed, self.params, self.out_features)
        return vnni_int4.reference_product(rows, *self._unpacked, self.bias)

    def kernel_parts(self) -> tuple[torch.Tensor | None, ...] | None:
        """What :meth:`multiply` passes the kernel (vnni, avx2) besides the rows and channels (packed, params,
        bias), or None where torch's ops run."""
        if self._kernel is None:
            return None
        buffers = self._buffers  # read directly: nn.Module's attribute lookup costs ~1 µs, ~300 times a decode step
        return buffers["packed"], buffers["params"], buffers["bias"]

    def forward(self, x):
        rows = x.reshape(-1, self.in_features).float()
        if rows.shape[0] == 0:
            out = rows.new_zeros((0, self.out_features))
        else:
            out = self.multiply(rows.contiguous())
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int4_or_int8_dynamic(linear: torch.nn.Linear) -> torch.nn.Module:
    """The int4-dynamic variant's Linear: int4 where a group width divides the inputs, else int8-dynamic."""
    if group_width(linear.in_features) is None:
        return Int8DynamicLinear(linear)
    return Int4DynamicLinear(linear)
