"""Which precision variant each model stage runs, decided from the settings and the hardware
without torch or a model (so `./run.sh settings` can print it); the variants themselves are
pipeline/precision.py.

``PRECISION`` (per stage ``<STAGE>_PRECISION``) names what a stage computes in: a variant
(``float32``, ``bfloat16``, ``float16``, ``int8-dynamic``, ``int8-weight``, ``int4-dynamic``, ``int4-weight``) or a policy:
``auto`` = bfloat16 on a CPU with avx512_bf16 or AMX and on a GPU with bf16, float32 on other
CPUs, float16 on a GPU without bf16; ``fast`` = the per-hardware table :data:`FAST`.
"""
from __future__ import annotations

from collections.abc import Callable

from pipeline.config import CUDA_ONLY_VARIANTS, PRECISION_POLICIES, PRECISION_VARIANTS, ConfigError
from pipeline.cpu_features import cpu_packs_bf16, cpu_runs_int4, cpu_sums_int8_exactly

# A CPU with AMX is of the cpu-bf16 kind: oneDNN is held below AMX there (pipeline.cpu_features).
CPU_BF16, CPU_PLAIN, CUDA = "cpu-bf16", "cpu", "cuda"

# Chosen by measurement (speed, memory, fidelity per stage and variant; it writes the choice as an
# env file). Re-measure with
#   MODEL_SOURCE=standin STANDIN_PROFILE=faithful ONLY_CPU=true TORCH_THREADS=2 \
#     python -m profiling.select_variants --rounds 2
# The cpu-bf16 row: faithful stand-ins, 2-core AMD EPYC with avx512_bf16, quiet machine, 2 rounds
# (docs/performance.md, "Precision variants"); batch time vs float32, fidelity vs float32:
#   embed     bfloat16 2.21x, cosine min 0.9999; int8-dynamic 2.53x, cosine min 0.9989 on random weights,
#             but trained weights drift more: on all-MiniLM-L6-v2 int8-dynamic's 1 - cosine was about 10x its
#             same-shape stand-in's, bfloat16's about 3-5x (docs/performance.md, "Fidelity on real weights";
#             docs/real_fidelity.json). Scaled so, int8-dynamic's 0.9989 becomes about 0.986 < 0.99, and
#             select_variants (which now scales the stand-ins' embed cosines so) picks bfloat16.
#   rerank    bfloat16 1.77x; int8-dynamic 1.93x but top-3 agreement 0.875 < 0.9 on random weights. With the VNNI
#             kernel (pipeline/kernels/vnni_int8.py): bfloat16 1.66x, int8-dynamic 2.36x, top-3 0.917, just over
#             the bar on random weights, where real weights drift about 10x more (embed, above): bfloat16 kept
#   sentiment bfloat16 1.56x, int8-dynamic 2.11x; toxicity bfloat16 2.13x, int8-dynamic 2.33x; labels 8/8 (2 rounds
#             alone with the VNNI kernel, 2026-12-02; before it, at 44dae42, bfloat16 had led sentiment 1.96x
#             against 1.48x and toxicity was within noise)
#   int4-weight: slower than float32 in every encoder stage (0.70-0.86x at 44dae42) and far from it in
#             embed and rerank (all-MiniLM-L6-v2's real cosine min 0.89): no entry
#   int4-dynamic: the LLM's decode step 0.61-0.75x int8-dynamic's, a whole answer level with it (slower
#             prefill), but 4-bit rounding's drift: teacher-forced top-1 0.25 vs int8-dynamic's 0.86 on random
#             weights (docs/performance.md section 21): no entry. In the encoders 1.9-2.8x float32 (one round,
#             d93ea7e): below the bars in embed and rerank; the rule picked it for sentiment by a margin within
#             the noise (408 vs 457 ms), where 4-bit's real-weights drift is unbounded by 8 labels: not taken
#   generate  STILL PROVISIONAL: on random-weight stand-ins no cheaper variant keeps greedy answers
#             equal to float32 (near-tied logits), so the rule picks float32 there; int8-dynamic is
#             kept for speed (the whole-service runs in docs/performance.md); every variant is
#             batch-invariant (tests/unit/test_precision.py). Rerun with the real model before trusting it.
# A CPU with AMX has no row of its own: its oneDNN is held at avx512_bf16 (AMX's kernels sum a row
# by its batch-mates' count), so it runs the cpu-bf16 row's kernels. The row it had was measured with
# AMX's kernels (docs/performance.md, "Precision on the AMX Xeon"); re-measure it held before
# trusting the cpu-bf16 row there.
# The plain-CPU row (no avx512_bf16, no AMX) was never measured: a guess, int8-dynamic where bf16 is
# emulated, but float32 for embed (int8-dynamic's real-weights drift, above). PRECISION's help says so.
# The CUDA row is bfloat16, the fastest variant CUDA is offered (supported_variants).
FAST: dict[str, dict[str, str]] = {
    CPU_BF16: {"embed": "bfloat16", "rerank": "bfloat16", "generate": "int8-dynamic",
               "sentiment": "int8-dynamic", "toxicity": "int8-dynamic"},
    CPU_PLAIN: {"embed": "float32", "rerank": "int8-dynamic", "generate": "int8-dynamic",
                "sentiment": "int8-dynamic", "toxicity": "int8-dynamic"},
    CUDA: {"embed": "bfloat16", "rerank": "bfloat16", "generate": "bfloat16",
           "sentiment": "bfloat16", "toxicity": "bfloat16"},
}
# The dtype a variant's model is loaded in before its Linears are converted.
LOAD_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "int8-dynamic": "float32",
              "int8-weight": "bfloat16", "int4-dynamic": "float32", "int4-weight": "bfloat16"}
# How each hardware kind reads in a sentence.
HARDWARE_WORDS = {CPU_BF16: "a CPU with avx512_bf16 (or AMX, held below it)",
                  CPU_PLAIN: "a CPU without avx512_bf16 or AMX", CUDA: "a CUDA GPU"}


def hardware_kind(device: str, bf16_cpu: Callable[[], bool]) -> str:
    if device == "cuda":
        return CUDA
    return CPU_BF16 if bf16_cpu() else CPU_PLAIN


def _cuda_bf16() -> bool:
    import torch
    return torch.cuda.is_bf16_supported()


def supported_variants(device: str, *, cuda_bf16: Callable[[], bool] = _cuda_bf16,
                       int8_cpu: Callable[[], bool] = cpu_sums_int8_exactly,
                       packs_bf16: Callable[[], bool] = cpu_packs_bf16,
                       int4_cpu: Callable[[], bool] = cpu_runs_int4) -> tuple[str, ...]:
    """What this device is offered. A CPU: every variant but float16 (bf16 ones slowly without
    avx512_bf16; float16 is several times slower than float32 there), int8-dynamic only with
    VNNI or AVX2 (fbgemm's and oneDNN's int8 sums saturate without VNNI: wrong, not only slow; the project's
    AVX2 kernel sums exactly there), int4-dynamic likewise (its kernels: AVX-512 VNNI's, or AVX2's; torch's ops
    give its bits where neither is built, slower),
    bfloat16 only where oneDNN packs its weights (AVX-512 BW/VL/DQ or avx_ne_convert: not on an
    AVX2-only CPU), int4-weight only where torch's int4 kernel has a vector path (AVX2 and FMA: else
    a scalar loop). CUDA: bfloat16 (where the
    GPU has it) and float16, the two whose every stage gives a row the same bits alone and batched
    there (tests/unit/test_precision.py's CUDA cases, H100). Not float32: its embeddings and
    chunked attention change with batch-mates on CUDA. Not int8: its decode step was slower than
    bfloat16's on an H100 (52 / 52 / 46 ms against 30 / 32 / 34 at 1 / 8 / 32 sequences,
    docs/performance.md)."""
    if device != "cuda":
        left_out = set() if int8_cpu() else {"int8-dynamic", "int4-dynamic"}
        left_out |= set() if packs_bf16() else {"bfloat16"}
        left_out |= set() if int4_cpu() else {"int4-weight"}
        return tuple(v for v in PRECISION_VARIANTS if v not in left_out)
    return ("bfloat16", *CUDA_ONLY_VARIANTS) if cuda_bf16() else CUDA_ONLY_VARIANTS


def auto_variant(device: str, *, bf16_cpu: Callable[[], bool], cuda_bf16: Callable[[], bool] = _cuda_bf16) -> str:
    """PRECISION=auto: bfloat16 where the hardware computes it natively, else float32 on a CPU
    and float16 on a GPU."""
    if device == "cuda":
        return "bfloat16" if cuda_bf16() else "float16"
    return "bfloat16" if bf16_cpu() else "float32"


def resolve_variant(requested: str, stage: str, device: str, variable: str, *,
                    bf16_cpu: Callable[[], bool], **detectors) -> str:
    """The variant a stage runs for PRECISION `requested` (read from `variable`).

    `auto` and `fast` pick per hardware (`fast` falls back to auto's choice where this device
    cannot run the table's entry); a variant asked for by name that the device cannot run is a
    ConfigError naming `variable`."""
    supported = supported_variants(device, **detectors)
    auto = {k: v for k, v in detectors.items() if k == "cuda_bf16"}
    if requested == "auto":
        return auto_variant(device, bf16_cpu=bf16_cpu, **auto)
    if requested == "fast":
        variant = FAST[hardware_kind(device, bf16_cpu)][stage]
        return variant if variant in supported else auto_variant(device, bf16_cpu=bf16_cpu, **auto)
    if requested not in supported:
        where = "the CPU" if device != "cuda" else "this CUDA device"
        raise ConfigError(f"{variable}={requested!r} is not valid on {where}: expected "
                          f"{', '.join(PRECISION_POLICIES + supported)}")
    return requested
