"""Precision variants of a model stage: which one runs where (the arithmetic is pipeline.kernels).

* ``float32``: the model as loaded (the oracle's precision by default).
* ``bfloat16``: the whole model in bfloat16 (``float16`` likewise, on CUDA only).
* ``int8-dynamic``: every ``nn.Linear`` becomes :class:`~pipeline.kernels.int8.Int8DynamicLinear`:
  int8 weights with one scale per output channel; each row of the flattened input (one token) is
  quantized with its own scale at run time, multiplied int8 x int8 into int32 (fbgemm or
  ``torch._int_mm``, the same bits), and scaled back by row scale x channel scale, plus the
  float32 bias (the quantize and the rescale as two C++ passes where
  :mod:`pipeline.kernels.fused_int8` is built; the same bits). Integer accumulation is exact and every step is per row, so a row's output
  cannot depend on its batch-mates. Everything but the Linears (embeddings, layer norms,
  attention's own matmuls, softmax) stays float32.
* ``int8-weight``: weight-only; the model is loaded in bfloat16 and every ``nn.Linear`` becomes
  :class:`~pipeline.kernels.int8.Int8WeightLinear`: int8 per-channel weights, bfloat16
  activations, ``torch._weight_int8pack_mm``. Meant for CPUs with bf16 (avx512_bf16/AMX); on a
  CPU without bf16 it runs, but bfloat16 arithmetic is emulated there and slow. CUDA is offered
  neither int8 variant.
* ``int4-weight``: weight-only, as int8-weight but with group-wise 4-bit weights (a bfloat16 scale and
  offset per 128 input columns): every ``nn.Linear`` the packed int4 kernel takes becomes
  :class:`~pipeline.kernels.int4.Int4WeightLinear` (`torch.ops.aten._weight_int4pack_mm_for_cpu`),
  the others (label and score heads) :class:`~pipeline.kernels.int8.Int8WeightLinear`. A quarter of
  bfloat16's weight bytes: what a decode step at its memory floor reads. CPU only.
* ``int4-dynamic``: int4-weight's 4-bit codes, scales and offsets, with int8-dynamic's activations: each row
  quantized to int8 at run time, each group's code x code sums exact (VNNI), then per group scale and offset
  in float32 in one fixed order (:class:`~pipeline.kernels.int4.Int4DynamicLinear`,
  :mod:`pipeline.kernels.vnni_int4`); a Linear whose input width no group divides becomes int8-dynamic.
  Loaded in float32 like int8-dynamic; half its weight bytes, without widening each weight to a float (what
  keeps int4-weight's product above its memory floor). Offered where int8-dynamic is. CPU only.

Which variant a stage runs (``PRECISION``: ``auto``, ``fast`` or a variant by name) is decided
by :mod:`pipeline.precision_policy`, without torch. Conversion happens once at load, layer by layer, and drops each float weight
as soon as its int8 copy exists.

Every variant of every stage is meant to be batch-invariant, on the CPU and on CUDA (bfloat16 and
float16 there): a request's outputs are the same bits alone and in any batch. The int8 Linears are
so by construction; the float Linears left, the RMSNorms and every model's attention are made so by
:func:`~pipeline.kernels.batch_invariance.make_batch_invariant` (on CUDA: every per-row sum in
launches of one shape). Checked by tests/unit/test_precision.py (whole stand-in models) and
tests/unit/test_batch_invariance.py (the decode step at Qwen2.5-0.5B's width) on the CPU; their
CUDA cases run only where a GPU is.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from pipeline.kernels.batch_invariance import make_batch_invariant
from pipeline.kernels.fused_linears import fuse_linears
from pipeline.kernels.int4 import int4_or_int8_dynamic, int4_or_int8_weight
from pipeline.kernels.int8 import Int8DynamicLinear, Int8WeightLinear, convert_linears, untie_output_embeddings
from pipeline.kernels.versions import check_kernel_versions

# The quantized variants: what each converts a model's nn.Linears to.
QUANTIZED: dict[str, Callable[..., torch.nn.Module]] = {"int8-dynamic": Int8DynamicLinear, "int8-weight": Int8WeightLinear,
                                                        "int4-dynamic": int4_or_int8_dynamic, "int4-weight": int4_or_int8_weight}


def apply_precision(model, precision: str, **int8_options):
    """The model in `precision`, batch-invariant: float variants are the dtype it was loaded in;
    quantized ones convert its Linears (the model must have been loaded in LOAD_DTYPE[precision]);
    `int8_options` go to each int8-dynamic Linear (Int8DynamicLinear's kernel and fused: profiling/real_fidelity.py
    measures every kernel; serving passes none).
    Then its attention and its remaining float Linears are made batch-invariant
    (:func:`~pipeline.kernels.batch_invariance.make_batch_invariant`), whatever the variant. First, on the
    CPU, a Qwen2 layer's Linears of one input are fused into one (:func:`~pipeline.kernels.fused_linears.fuse_linears`:
    the same bits in every variant), which the variant then converts.
    Raises ConfigError where torch or transformers is outside the versions the kernels were
    verified against on the model's device (pipeline.kernels.versions)."""
    check_kernel_versions(next(model.parameters()).device.type)
    untie_output_embeddings(model)  # the output layer gets its own int8 (or, on the CPU, packed) weight
    fuse_linears(model)  # on the CPU a Qwen2 layer's q/k/v and gate/up become one Linear each (the same bits)
    if precision in QUANTIZED:
        with torch.no_grad():
            convert_linears(model, functools.partial(QUANTIZED[precision], **int8_options))
    make_batch_invariant(model)
    return model


def model_nbytes(module) -> int:
    """A model's weight bytes: parameters, buffers (the int4 packed weights among them), and the fbgemm-packed
    int8 weights."""
    tensors = list(module.parameters()) + list(module.buffers())
    packed = sum(m.packed_nbytes() for m in module.modules() if isinstance(m, Int8DynamicLinear))
    return sum(t.numel() * t.element_size() for t in tensors) + packed
