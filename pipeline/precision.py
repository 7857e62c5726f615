"""Precision variants of a model stage: which one runs where (the arithmetic is pipeline.kernels).

* ``float32``: the model as loaded (the oracle's precision by default).
* ``bfloat16``: the whole model in bfloat16.
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
  activations, ``torch._weight_int8pack_mm``. Meant for CPUs with bf16 (avx512_bf16/AMX) and
  CUDA; on a CPU without bf16 it runs, but bfloat16 arithmetic is emulated there and slow.

``PRECISION=exact`` keeps the ``*_DTYPE`` settings; ``fast`` picks the variant in :data:`FAST`
for this hardware. Conversion happens once at load, layer by layer, and drops each float weight
as soon as its int8 copy exists.

Every variant of every stage is batch-invariant on the CPU: a request's outputs are the same bits
alone and in any batch (tests/unit/test_precision.py). The int8 Linears are so by construction;
the float Linears left and every model's attention are made so by
:func:`~pipeline.kernels.batch_invariance.make_batch_invariant`. On CUDA the attention is, and
the float Linears run cuBLAS as they are (not verified there).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.config import PRECISION_VARIANTS, ConfigError
from pipeline.kernels.batch_invariance import make_batch_invariant
from pipeline.kernels.int8 import Int8DynamicLinear, Int8WeightLinear, convert_linears, untie_output_embeddings
from pipeline.kernels.versions import check_kernel_versions

CPU_AMX, CPU_BF16, CPU_PLAIN, CUDA = "cpu-amx", "cpu-bf16", "cpu", "cuda"

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
# The cpu-amx row: a 2-core Intel Xeon with AMX (amx_bf16, amx_int8), faithful stand-ins, 1 thread
# (docs/performance.md, "Precision on the AMX Xeon"). Encoders by select_variants --rounds 2 --repeat 3
# (batch of 8 vs float32): embed bfloat16 3.03x (int8-dynamic 2.27x; alone int8 25 ms vs bf16 38),
# sentiment bfloat16 3.50x (int8-dynamic 1.72x), toxicity bfloat16 3.80x (int8-dynamic 1.62x), all
# labels equal and cosine >= 0.9988; rerank bfloat16 3.74x vs int8-dynamic 1.26x (one round, busy).
# generate per decode step at 1 / 8 / 16 sequences (bench_decode, "Decode step: fused int8 and
# loop-free attention"): int8-dynamic 65 / 120 / 160 ms, bfloat16 142 / 161 / 178, int8-weight
# 94 / 220 / 376: the bytes of weights read per step decide here, and AMX's bf16 tiles do not.
# The plain-CPU and CUDA rows are not measured: int8-dynamic where bf16 is emulated, bfloat16 on a GPU.
FAST: dict[str, dict[str, str]] = {
    CPU_AMX: {"embed": "bfloat16", "rerank": "bfloat16", "generate": "int8-dynamic",
              "sentiment": "bfloat16", "toxicity": "bfloat16"},
    CPU_BF16: {"embed": "int8-dynamic", "rerank": "bfloat16", "generate": "int8-dynamic",
               "sentiment": "int8-dynamic", "toxicity": "bfloat16"},
    CPU_PLAIN: {"embed": "int8-dynamic", "rerank": "int8-dynamic", "generate": "int8-dynamic",
                "sentiment": "int8-dynamic", "toxicity": "int8-dynamic"},
    CUDA: {"embed": "bfloat16", "rerank": "bfloat16", "generate": "bfloat16",
           "sentiment": "bfloat16", "toxicity": "bfloat16"},
}
# The dtype a variant's model is loaded in before its Linears are converted.
LOAD_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "int8-dynamic": "float32", "int8-weight": "bfloat16"}


def hardware_kind(device: str, bf16_cpu: Callable[[], bool], amx_cpu: Callable[[], bool]) -> str:
    if device == "cuda":
        return CUDA
    if amx_cpu():
        return CPU_AMX
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
                    bf16_cpu: Callable[[], bool], amx_cpu: Callable[[], bool], **cuda_detectors) -> str | None:
    """The variant a stage runs, or None for 'exact' (the caller keeps its dtype settings).

    `fast` takes the table's entry, or exact where this device cannot run it; a variant
    asked for by name that the device cannot run is a ConfigError naming `variable`."""
    if requested == "exact":
        return None
    supported = supported_variants(device, **cuda_detectors)
    if requested == "fast":
        variant = FAST[hardware_kind(device, bf16_cpu, amx_cpu)][stage]
        return variant if variant in supported else None
    if requested not in supported:
        where = "the CPU" if device != "cuda" else "this CUDA device"
        raise ConfigError(f"{variable}={requested!r} is not valid on {where}: expected exact, fast or "
                          f"{', '.join(supported)}")
    return requested


# The int8 variants: the Linear each converts a model's nn.Linears to.
QUANTIZED = {"int8-dynamic": Int8DynamicLinear, "int8-weight": Int8WeightLinear}


def apply_precision(model, precision: str):
    """The model in `precision`, batch-invariant: float variants are the dtype it was loaded in;
    int8 ones convert its Linears (the model must have been loaded in LOAD_DTYPE[precision]).
    Then its attention and its remaining float Linears are made batch-invariant
    (:func:`~pipeline.kernels.batch_invariance.make_batch_invariant`), whatever the variant.
    Raises ConfigError where torch or transformers is outside the versions the kernels were
    verified against (pipeline.kernels.versions)."""
    check_kernel_versions()
    if precision in QUANTIZED:
        untie_output_embeddings(model)
        with torch.no_grad():
            convert_linears(model, QUANTIZED[precision])
    make_batch_invariant(model)
    return model


def model_nbytes(module) -> int:
    """A model's weight bytes: parameters, buffers, and the fbgemm-packed int8 weights."""
    tensors = list(module.parameters()) + list(module.buffers())
    packed = sum(m.packed_nbytes() for m in module.modules() if isinstance(m, Int8DynamicLinear))
    return sum(t.numel() * t.element_size() for t in tensors) + packed
