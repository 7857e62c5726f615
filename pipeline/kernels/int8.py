"""int8 Linears: per-output-channel int8 weights, and the in-place conversion of a model's nn.Linears.

* :class:`Int8DynamicLinear`: int8 activations quantized per row at run time, int32 accumulation
  (the project's VNNI kernel where built, else fbgemm where exact, else the project's AVX2 kernel where built,
  else `torch._int_mm` where exact), float32 in and out. A row's output does not depend on its batch-mates.
* :class:`Int8WeightLinear`: bfloat16 activations, `torch._weight_int8pack_mm`.

Conversion drops each float weight as soon as its int8 copy exists.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from pipeline.config import ConfigError
from pipeline.kernels import avx2_int8, vnni_int8
from pipeline.kernels.exact_check import sums_int8_exactly
from pipeline.kernels.fbgemm import AnchoredFbgemm, fbgemm_is_exact
from pipeline.kernels.fused_int8 import fused_ops

# Rows quantized at a time at load: bounds the temporary float copies (lm_head is 151936 x 896).
_QUANTIZE_ROWS = 8192


def quantize_per_channel(weight):
    """(out, in) float weight -> int8 of the same shape and one float32 scale per output row."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], _QUANTIZE_ROWS):
        rows = weight[start:start + _QUANTIZE_ROWS].float()
        scale = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q[start:start + _QUANTIZE_ROWS] = (rows / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        scales[start:start + _QUANTIZE_ROWS] = scale
    return q, scales


@functools.cache
def int_mm_is_exact() -> bool:
    """Whether `torch._int_mm` sums int8 exactly here (checked once, on the worst case: oneDNN's
    kernels without VNNI saturate 16-bit pair sums there, as fbgemm's do)."""
    return sums_int8_exactly(lambda qweight, scale, codes: torch._int_mm(codes, qweight.t()).float() * scale)


def row_codes(x):
    """Dynamic per-row quantization of a 2-D float tensor: one scale per row, never per tensor.
    Returns the int8 codes as floats (what fbgemm takes) and the (rows, 1) scales."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    return (x / scale).round().clamp(-127, 127), scale


def quantize_rows(x):
    """:func:`row_codes` as int8 (what `torch._int_mm` takes)."""
    codes, scale = row_codes(x)
    return codes.to(torch.int8), scale


class _QuantizedLinear(torch.nn.Module):
    """What both int8 Linears share: the int8 (out, in) weight, its scales, the bias."""
    scale_dtype = torch.float32
    qweight: Any  # a registered buffer: the int8 weight, or None once a packed copy replaces it
    weight_scale: torch.Tensor  # a registered buffer: one scale per output channel

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scales = quantize_per_channel(linear.weight.detach())
        self.register_buffer("qweight", q)
        self.register_buffer("weight_scale", scales.to(self.scale_dtype))
        bias = None if linear.bias is None else linear.bias.detach().to(self.scale_dtype)
        self.register_buffer("bias", bias)

    def int8_weight(self):
        """The (out, in) int8 weight, wherever it is kept."""
        return self.qweight

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _finish(self, out, x_shape):
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x_shape[:-1], self.out_features)


# The kernels that multiply by vnni_int8.pack's copy of the weight in one C++ call: its extension, its op.
_PACKED = {"vnni": (vnni_int8.EXTENSION, "vnni_linear"), "avx2": (avx2_int8.EXTENSION, "avx2_linear")}
PACKED_KERNELS = frozenset(_PACKED)


def _usable(kernel: str, in_features: int) -> bool:
    if kernel in _PACKED:
        return _PACKED[kernel][0].ops() is not None
    if kernel == "fbgemm":
        return in_features >= 2 and fbgemm_is_exact()  # the anchor row takes two columns
    return int_mm_is_exact()


def auto_kernel(in_features: int = 2) -> str | None:
    """The kernel ``kernel="auto"`` multiplies with here, for Linears of `in_features` inputs: the first of
    :data:`Int8DynamicLinear.ORDER` this machine can run, None where none sums exactly."""
    return next((k for k in Int8DynamicLinear.ORDER if _usable(k, in_features)), None)


class Int8DynamicLinear(_QuantizedLinear):
    """int8 weights (per output channel) x int8 activations (per row), int32 accumulation.

    Four kernels give the same bits (an int32 sum of int8 products is exact in any order); ``kernel``
    names the first to try, ``"auto"`` the first of :data:`ORDER` this machine can use:

    * ``"vnni"``: :mod:`pipeline.kernels.vnni_int8`, the whole product in one C++ call, where that
      extension is built and the CPU has AVX-512 VNNI;
    * ``"fbgemm"``: :class:`AnchoredFbgemm`, where :func:`fbgemm_is_exact`; its per-row quantization and
      rescale + bias run as the C++ passes of :mod:`pipeline.kernels.fused_int8` where built (same bits;
      ``fused=False`` keeps the torch ops);
    * ``"avx2"``: :mod:`pipeline.kernels.avx2_int8`, vnni_int8's one call without VNNI (four instructions
      for its one, no 16-bit sum that saturates), where built: what an AVX2-only CPU multiplies with;
    * ``"int_mm"``: `torch._int_mm`, which on the CPU takes any shape (torch 2.13: M=1, K=7, N=5).
      The weight is passed as the transposed view of its (out, in) rows: as fast as a row-major
      copy or faster here, and no second copy.

    CPU only: CUDA is not offered int8 (pipeline/precision_policy.py). A packed copy replaces the plain
    weight (:meth:`use_kernel`)."""

    KERNELS = ("auto", "vnni", "fbgemm", "avx2", "int_mm")
    ORDER = ("vnni", "fbgemm", "avx2", "int_mm")  # fastest first (docs/performance.md, "int8 in one call")

    def __init__(self, linear: torch.nn.Linear, *, kernel: str = "auto", fused: bool = True):
        super().__init__(linear)
        self.fused = fused
        # kernel -> its copy of the weight: its op and vnni_int8.pack's pair, an AnchoredFbgemm, or the plain int8
        # weight
        self._weights: dict[str, Any] = {"int_mm": self.qweight}
        self._kernel = "int_mm"
        self.use_kernel(kernel)

    @property
    def kernel(self) -> str:
        """The kernel this Linear multiplies with: vnni, fbgemm, avx2 or int_mm."""
        return self._kernel

    def use_kernel(self, kernel: str, *, keep: bool = False) -> str:
        """Multiply with `kernel` (one of :data:`KERNELS`) from now on, or, where this machine cannot, with the
        next of :data:`ORDER` that it can; returns the kernel taken. Its copy of the weight replaces the
        others, or joins them with `keep` (a benchmark switching kernels back and forth packs each once).
        Raises ConfigError where no kernel left sums exactly."""
        if kernel not in self.KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(self.KERNELS)}, got {kernel!r}")
        tried = self.ORDER if kernel == "auto" else self.ORDER[self.ORDER.index(kernel):]
        chosen = next((k for k in tried if _usable(k, self.in_features)), None)
        if chosen is None:
            raise ConfigError("int8-dynamic needs an int8 product that sums exactly, and neither fbgemm nor "
                              "torch._int_mm does on this CPU (no VNNI: their 16-bit pair sums saturate), and the "
                              "project's AVX2 kernel is not built (python -m pipeline.kernels.compiled): "
                              "choose float32 or bfloat16 for this stage")
        if chosen not in self._weights:
            weight = self.int8_weight()
            self._weights[chosen] = (self._packed_copy(chosen, weight) if chosen in _PACKED else
                                     AnchoredFbgemm(weight, self.weight_scale) if chosen == "fbgemm" else weight)
        if not keep:
            self._weights = {chosen: self._weights[chosen]}
        self._kernel = chosen
        self.qweight = self._weights.get("int_mm")  # a registered buffer only while int_mm's copy is kept
        return chosen

    @staticmethod
    def _packed_copy(kernel: str, weight) -> tuple[Any, ...]:
        """A packed kernel's op (its extension loaded: _usable checked it) and the weight packed for it."""
        extension, op = _PACKED[kernel]
        return (extension.registered(op), *vnni_int8.pack(weight))

    def int8_weight(self):
        """The (out, in) int8 weight."""
        kernel, weight = next(iter(self._weights.items()))
        if kernel in _PACKED:
            return vnni_int8.unpack(weight[1], self.out_features, self.in_features)
        return weight.unpacked() if kernel == "fbgemm" else weight

    def multiply(self, rows):
        """(n, in) float32 rows, n >= 1 -> (n, out) float32: the product without forward's reshapes and casts
        (a decode step's rows are already so), by a packed kernel (vnni, avx2) where it is the one in use, else
        forward."""
        parts = self.kernel_parts()
        if parts is None:
            return self.forward(rows)
        return self._weights[self._kernel][0](rows, *parts)

    def kernel_parts(self) -> tuple[Any, ...] | None:
        """What :meth:`multiply` passes the packed kernel in use besides the rows (packed weight, offsets, weight
        scale, bias), or None where fbgemm or int_mm is in use."""
        if self._kernel not in _PACKED:
            return None
        buffers = self._buffers  # read directly: nn.Module's attribute lookup costs ~1 µs, ~200 times a decode step
        return (*self._weights[self._kernel][1:], buffers["weight_scale"], buffers["bias"])

    def packed_nbytes(self) -> int:
        """Bytes of the packed copy this Linear multiplies with, which buffers() does not see (0 for the plain
        int8 weight, a buffer); copies a benchmark keeps beside it are not counted."""
        weight = self._weights[self._kernel]
        if self._kernel in _PACKED:
            return sum(t.numel() * t.element_size() for t in weight[1:])
        return self.in_features * self.out_features if self._kernel == "fbgemm" else 0

    def forward(self, x):
        rows = x.reshape(-1, self.in_features).float()
        n = rows.shape[0]
        if n == 0:
            return self._finish(rows.new_zeros((0, self.out_features)), x.shape).to(x.dtype)
        if self._kernel in _PACKED:
            return self.multiply(rows).reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        weight = self._weights[self._kernel]
        if self._kernel == "fbgemm":
            ops = fused_ops() if self.fused else None
            if ops is not None:
                codes, row_scale = ops.anchored_row_codes(rows, weight.anchor)
                out = ops.rescale_rows(weight.anchored_sums(codes), 1, row_scale, self.bias)
                return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
            codes, row_scale = row_codes(rows)
            sums = weight.sums(codes)
        else:
            xq, row_scale = quantize_rows(rows)
            # Channel scale first, as fbgemm applies it: both paths round alike.
            sums = torch._int_mm(xq, weight.t()).float() * self.weight_scale
        return self._finish(sums * row_scale, x.shape).to(x.dtype)


class Int8WeightLinear(_QuantizedLinear):
    """int8 weights (per output channel), bfloat16 activations: `torch._weight_int8pack_mm`."""
    scale_dtype = torch.bfloat16

    def forward(self, x):
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] == 0:
            return self._finish(rows.new_zeros((0, self.out_features)), x.shape)
        out = torch._weight_int8pack_mm(rows, self.qweight, self.weight_scale)
        return self._finish(out, x.shape)


def untie_output_embeddings(model) -> None:
    """A tied lm_head shares the input embedding's weight: quantizing it must not touch
    the lookups, and nothing may tie the two again (the quantized head is its own module)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
        text_config = getattr(config, "get_text_config", lambda **_: None)()
        if text_config is not None and text_config is not config:
            text_config.tie_word_embeddings = False


def convert_linears(model, make: Callable[[torch.nn.Linear], torch.nn.Module]) -> int:
    """Replace every nn.Linear under `model` in place by `make(linear)`; returns how many were converted."""
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    converted = 0
    for name, linear in linears:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(linear))  # the float Linear is dropped here
        converted += 1
    return converted
