"""Precision variants of a model stage: how its weights are stored and its matmuls run.

* ``float32``: the model as loaded (the oracle's precision by default).
* ``bfloat16``: the whole model in bfloat16.
* ``int8-dynamic``: every ``nn.Linear`` becomes :class:`Int8DynamicLinear`: int8 weights
  with one scale per output channel; each row of the flattened input (one token) is
  quantized with its own scale at run time, ``torch._int_mm`` multiplies int8 x int8
  into int32, and the result is scaled back by row scale x channel scale, plus the
  float32 bias. Integer accumulation is exact and every step is per row, so a row's
  output cannot depend on its batch-mates. Everything but the Linears (embeddings,
  layer norms, attention's own matmuls, softmax) stays float32.
* ``int8-weight``: weight-only; the model is loaded in bfloat16 and every ``nn.Linear``
  becomes :class:`Int8WeightLinear`: int8 per-channel weights, bfloat16 activations,
  ``torch._weight_int8pack_mm``. Meant for CPUs with bf16 (avx512_bf16/AMX) and CUDA;
  on a CPU without bf16 it runs, but bfloat16 arithmetic is emulated there and slow.

``PRECISION=exact`` keeps today's behaviour (the ``*_DTYPE`` settings); ``fast`` picks
the variant in :data:`FAST` for this hardware. Conversion happens once at load, layer
by layer, and drops each float weight as soon as its int8 copy exists.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch

from pipeline.config import PRECISION_VARIANTS, ConfigError

CPU_BF16, CPU_PLAIN, CUDA = "cpu-bf16", "cpu", "cuda"

# Chosen by measurement (speed, memory, fidelity per stage and variant; it writes the choice as an
# env file). Re-measure with
#   MODEL_SOURCE=standin STANDIN_PROFILE=faithful ONLY_CPU=true TORCH_THREADS=2 \
#     python -m profiling.select_variants --rounds 2
# The cpu-bf16 row: faithful stand-ins, 2-core AMD EPYC with avx512_bf16, quiet machine, 2 rounds
# (docs/performance.md, "Precision variants"); batch time vs float32, fidelity vs float32:
#   embed     int8-dynamic 2.53x (bfloat16 2.21x), cosine min 0.9989
#   rerank    bfloat16 1.77x; int8-dynamic 1.93x but top-3 agreement 0.875 < 0.9 on random weights
#   sentiment int8-dynamic 1.76x (bfloat16 1.56x), labels 8/8
#   toxicity  bfloat16 1.95x vs int8-dynamic 1.85x (within noise), labels 8/8
#   generate  STILL PROVISIONAL: on random-weight stand-ins no cheaper variant keeps greedy answers
#             equal to float32 (near-tied logits), so the rule picks float32 there; int8-dynamic is
#             kept for speed (the whole-service runs in docs/performance.md); every variant is
#             batch-invariant (tests/unit/test_precision.py). Rerun with the real model before trusting it.
# The plain-CPU and CUDA rows are not measured: int8-dynamic where bf16 is emulated, bfloat16 on a GPU.
FAST: dict[str, dict[str, str]] = {
    CPU_BF16: {"embed": "int8-dynamic", "rerank": "bfloat16", "generate": "int8-dynamic",
               "sentiment": "int8-dynamic", "toxicity": "bfloat16"},
    CPU_PLAIN: {"embed": "int8-dynamic", "rerank": "int8-dynamic", "generate": "int8-dynamic",
                "sentiment": "int8-dynamic", "toxicity": "int8-dynamic"},
    CUDA: {"embed": "bfloat16", "rerank": "bfloat16", "generate": "bfloat16",
           "sentiment": "bfloat16", "toxicity": "bfloat16"},
}
# The dtype a variant's model is loaded in before its Linears are converted.
LOAD_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "int8-dynamic": "float32", "int8-weight": "bfloat16"}
# Rows quantized at a time at load: bounds the temporary float copies (lm_head is 151936 x 896).
_QUANTIZE_ROWS = 8192


def hardware_kind(device: str, bf16_cpu: Callable[[], bool]) -> str:
    if device == "cuda":
        return CUDA
    return CPU_BF16 if bf16_cpu() else CPU_PLAIN


def _cuda_int8() -> bool:
    return torch.cuda.get_device_capability() >= (7, 5)  # int8 tensor cores, which _int_mm needs


def _cuda_bf16() -> bool:
    return torch.cuda.is_bf16_supported()


def supported_variants(device: str, *, cuda_int8: Callable[[], bool] = _cuda_int8,
                       cuda_bf16: Callable[[], bool] = _cuda_bf16) -> tuple[str, ...]:
    """What this device can run; every variant runs on a CPU (bf16 ones slowly without avx512_bf16)."""
    if device != "cuda":
        return PRECISION_VARIANTS
    bf16 = cuda_bf16()
    allowed = {"float32": True, "bfloat16": bf16, "int8-dynamic": cuda_int8(), "int8-weight": bf16}
    return tuple(v for v in PRECISION_VARIANTS if allowed[v])


def resolve_variant(requested: str, stage: str, device: str, variable: str, *,
                    bf16_cpu: Callable[[], bool], **cuda_detectors) -> str | None:
    """The variant a stage runs, or None for 'exact' (the caller keeps its dtype settings).

    `fast` takes the table's entry, or exact where this device cannot run it; a variant
    asked for by name that the device cannot run is a ConfigError naming `variable`."""
    if requested == "exact":
        return None
    supported = supported_variants(device, **cuda_detectors)
    if requested == "fast":
        variant = FAST[hardware_kind(device, bf16_cpu)][stage]
        return variant if variant in supported else None
    if requested not in supported:
        where = "the CPU" if device != "cuda" else "this CUDA device"
        raise ConfigError(f"{variable}={requested!r} is not valid on {where}: expected exact, fast or "
                          f"{', '.join(supported)}")
    return requested


# ----------------------------------------------------------------------------- quantized Linears

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


def row_codes(x):
    """Dynamic per-row quantization of a 2-D float tensor: one scale per row, never per tensor.
    Returns the int8 codes as floats (what fbgemm takes) and the (rows, 1) scales."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    return (x / scale).round().clamp(-127, 127), scale


def quantize_rows(x):
    """:func:`row_codes` as int8 (what `torch._int_mm` takes)."""
    codes, scale = row_codes(x)
    return codes.to(torch.int8), scale


class AnchoredFbgemm:
    """int8 x int8 -> int32 sums through fbgemm, bit-identical to `torch._int_mm`'s.

    fbgemm's dynamic linear is about 1.4-1.9x faster than `_int_mm` at decode's 1-16 rows
    (profiling/bench_int8_linear.py) but picks one activation scale for the whole input, which
    would let a batch-mate change a row's result. Our rows arrive already quantized per row
    (integers in -127..127); one extra anchor row holding -128 and 127 pins fbgemm's range to
    exactly [-128, 127], so its scale is exactly 1 and its zero point 128: it adds nothing and
    rounds nothing, and returns sum(codes x weight) x channel scale, each row on its own."""

    def __init__(self, qweight, weight_scale):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch, still shipped (2.13)
            weight = torch._make_per_channel_quantized_tensor(
                qweight, weight_scale.double(), torch.zeros(qweight.shape[0], dtype=torch.long), 0)
            self.packed = torch.ops.quantized.linear_prepack(weight, None)
        self.anchor = torch.zeros(1, qweight.shape[1])
        self.anchor[0, 0], self.anchor[0, 1] = -128.0, 127.0

    def sums(self, codes):
        """codes: (rows, in) float integers -> (rows, out) float32 int32-sums x channel scale."""
        return torch.ops.quantized.linear_dynamic(torch.cat([self.anchor, codes]), self.packed, False)[1:]

    def unpacked(self):
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()


@functools.cache
def fbgemm_is_exact() -> bool:
    """Whether this CPU's fbgemm sums int8 exactly (checked once, on the worst case: without
    VNNI its 16-bit pair sums saturate at full-range codes), so the anchored path may be used."""
    try:
        qweight = torch.full((24, 64), 127, dtype=torch.int8)
        qweight[1::2] = -127
        scale = torch.full((24,), 0.0123)  # not a power of two: the rounding must agree too
        codes = torch.full((5, 64), 127.0)
        codes[1::2] = -127.0
        expected = torch._int_mm(codes.to(torch.int8), qweight.t()).float() * scale
        return torch.equal(AnchoredFbgemm(qweight, scale).sums(codes), expected)
    except (RuntimeError, AttributeError):  # a torch without fbgemm or the quantized ops
        return False


class _QuantizedLinear(torch.nn.Module):
    """What both int8 Linears share: the int8 (out, in) weight, its scales, the bias."""
    scale_dtype = torch.float32

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


class Int8DynamicLinear(_QuantizedLinear):
    """int8 weights (per output channel) x int8 activations (per row), int32 accumulation.

    On the CPU the weight is packed for fbgemm and multiplied by :class:`AnchoredFbgemm`
    where :func:`fbgemm_is_exact` (the packed copy replaces the plain one: no extra memory);
    otherwise `torch._int_mm`, which on the CPU takes any shape (torch 2.13: M=1, K=7, N=5).
    Both give the same bits. On CUDA `_int_mm` needs more than 16 rows and in/out sizes of at least 16 and multiples of
    8 (not verified on a GPU in this change): rows are zero-padded up to 17 (padding rows are rows of their own, so they change nothing else),
    and a layer whose sizes are not multiples of 8 stays a float Linear
    (:func:`convert_linears`). The weight is passed as the transposed view of its
    (out, in) rows: as fast as a row-major copy or faster here, and no second copy."""

    def __init__(self, linear: torch.nn.Linear, use_fbgemm: bool = True):
        super().__init__(linear)
        self._min_rows = 17 if self.qweight.is_cuda else 0
        self._fbgemm = None
        if use_fbgemm and not self.qweight.is_cuda and self.in_features >= 2 and fbgemm_is_exact():
            self._fbgemm = AnchoredFbgemm(self.qweight, self.weight_scale)
            self.qweight = None  # fbgemm's packed copy is the weight now

    def int8_weight(self):
        return self.qweight if self._fbgemm is None else self._fbgemm.unpacked()

    def packed_nbytes(self) -> int:
        """Bytes of the fbgemm-packed int8 weight, which buffers() does not see (0 without one)."""
        return 0 if self._fbgemm is None else self.in_features * self.out_features

    @staticmethod
    def cuda_compatible(linear: torch.nn.Linear) -> bool:
        return all(size >= 16 and size % 8 == 0 for size in (linear.in_features, linear.out_features))

    def forward(self, x):
        rows = x.reshape(-1, self.in_features).float()
        n = rows.shape[0]
        if n == 0:
            return self._finish(rows.new_zeros((0, self.out_features)), x.shape).to(x.dtype)
        if self._fbgemm is not None:
            codes, row_scale = row_codes(rows)
            sums = self._fbgemm.sums(codes)
        else:
            xq, row_scale = quantize_rows(rows)
            if n < self._min_rows:
                xq = torch.nn.functional.pad(xq, (0, 0, 0, self._min_rows - n))
            # Channel scale first, as fbgemm applies it: both paths round alike.
            sums = torch._int_mm(xq, self.qweight.t())[:n].float() * self.weight_scale
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


QUANTIZED = {"int8-dynamic": Int8DynamicLinear, "int8-weight": Int8WeightLinear}


def model_nbytes(module) -> int:
    """A model's weight bytes: parameters, buffers, and the fbgemm-packed int8 weights."""
    tensors = list(module.parameters()) + list(module.buffers())
    packed = sum(m.packed_nbytes() for m in module.modules() if isinstance(m, Int8DynamicLinear))
    return sum(t.numel() * t.element_size() for t in tensors) + packed


def _untie_output_embeddings(model) -> None:
    """A tied lm_head shares the input embedding's weight: quantizing it must not touch
    the lookups, and nothing may tie the two again (the quantized head is its own module)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
        text_config = getattr(config, "get_text_config", lambda **_: None)()
        if text_config is not None and text_config is not config:
            text_config.tie_word_embeddings = False


def convert_linears(model, variant: str) -> int:
    """Replace every nn.Linear under `model` in place; returns how many were converted."""
    make = QUANTIZED[variant]
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    converted = 0
    for name, linear in linears:
        if linear.weight.is_cuda and make is Int8DynamicLinear and not make.cuda_compatible(linear):
            continue  # _int_mm's CUDA shape rule: this layer stays a float Linear
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(linear))  # the float Linear is dropped here
        converted += 1
    return converted


def apply_precision(model, precision: str):
    """The model in `precision`: float variants are the dtype it was loaded in; int8 ones
    convert its Linears (the model must have been loaded in LOAD_DTYPE[precision])."""
    if precision in QUANTIZED:
        _untie_output_embeddings(model)
        with torch.no_grad():
            convert_linears(model, precision)
    return model


# ----------------------------------------------------------------------------- batch invariance

class RowInvariantLinear(torch.nn.Linear):
    """A bfloat16 Linear whose result for a row does not depend on how many rows come with it.

    oneDNN's bf16 CPU matmul takes one kernel for a single row and another for two or more, and
    they sum a long row (in_features of ~2000 and up: Qwen's 4864-wide down_proj) in a different
    order, so one decode step alone and the same step in a batch round differently. A lone row
    is run as two, the way every batch runs."""

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] != 1:
            return super().forward(x)
        out = torch.nn.functional.linear(rows.expand(2, -1).contiguous(), self.weight, self.bias)[:1]
        return out.reshape(*x.shape[:-1], self.out_features)


def make_bf16_linears_row_invariant(model) -> int:
    """Swap the class of every bfloat16 nn.Linear (no weight is copied); returns how many."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16]
    for linear in linears:
        linear.__class__ = RowInvariantLinear
    return len(linears)


BATCH_INVARIANT_ATTENTION = "batch_invariant_sdpa"


def _row_key_starts(attention_mask) -> list[int] | None:
    """The first key each row may see, or None where some row's visible keys are not one
    unbroken run to the end (padding in the middle: not a left-padded batch)."""
    visible = attention_mask[:, 0].any(dim=1)  # (rows, keys): seen by any of the row's queries
    starts = visible.int().argmax(dim=1)
    tail = torch.arange(visible.shape[1], device=visible.device)[None, :] >= starts[:, None]
    return starts.tolist() if torch.equal(visible, tail) else None


def _batch_invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, run for each row of a left-padded batch over its own keys.

    SDPA's CPU kernel sums keys in blocks counted from the first column, so left padding moves a
    row's block boundaries and its attention rounds differently from the row alone (visibly in
    bfloat16). Each padded row is sliced to its real keys and queries and given exactly what it
    would be given alone (transformers passes no mask where a row has no padding and its queries
    are 1 or all of its keys); a batch without padding is one call as before."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    starts = None if attention_mask is None or attention_mask.dtype != torch.bool else _row_key_starts(attention_mask)
    if starts is None or not any(starts):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q_len, kv_len = query.shape[2], key.shape[2]
    past = kv_len - q_len  # query i is key past + i
    output = query.new_zeros((query.shape[0], q_len, query.shape[1], value.shape[3]))
    for row, start in enumerate(starts):
        q0 = max(0, start - past)  # queries before it are padding: they keep zeros, nobody reads them
        mask = attention_mask[row:row + 1, :, q0:, start:]
        if q_len - q0 == 1 or q_len - q0 == kv_len - start:
            mask = None  # as transformers does for an unpadded row: is_causal for a whole prompt
        out, _ = sdpa_attention_forward(module, query[row:row + 1, :, q0:], key[row:row + 1, :, start:],
                                        value[row:row + 1, :, start:], mask, **kwargs)
        output[row, q0:] = out[0]
    return output, None


def use_batch_invariant_attention(model) -> None:
    """Make `model` (a transformers decoder) attend with :func:`_batch_invariant_sdpa`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(BATCH_INVARIANT_ATTENTION, _batch_invariant_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(BATCH_INVARIANT_ATTENTION, sdpa_mask)  # the masks SDPA gets
    model.set_attn_implementation(BATCH_INVARIANT_ATTENTION)
