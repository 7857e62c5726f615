"""int8-dynamic's whole product in one C++ call on a CPU with AVX-512 VNNI: quantize, multiply, rescale.

:class:`~pipeline.kernels.int8.Int8DynamicLinear` otherwise runs three passes (the rows quantized to
float codes after an anchor row, fbgemm's product, which quantizes them again and packs them, then the
rescale and bias): at a decode step's few rows most of that is not the product. Here one call:

* each row quantized as pipeline.kernels.fused_int8 does (scale max|x| clamped to 1e-12, / 127;
  codes x / scale rounded half to even), stored as unsigned bytes code + 128;
* int32 sums by VNNI's u8 x s8 dot products (``vpdpbusd``, four products a lane, no saturation) over
  the weight packed once in blocks of 16 output channels x 4 inputs, minus 128 x each channel's weight
  sum: the exact integer sum of code x weight;
* the output float(sum) x channel scale x row scale (+ bias), rounded one product at a time as
  ``torch._int_mm(...).float() * weight_scale`` and fused_int8's rescale round them.

An int32 sum of int8 products is exact in any order, so the result is the fbgemm and ``_int_mm``
paths' bits for every row at any row count (tests/unit/test_packed_int8.py): a machine where this is
not built, or whose CPU lacks AVX-512 VNNI, runs fbgemm with the same results. The work per call
follows the rows: the weight is read from memory once a call, the activations once per 64 output channels.
It is registered with torch's dispatcher (``EXTENSION.registered("vnni_linear")``): profilers see it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.kernels import huge_pages
from pipeline.kernels.compiled import CompiledExtension
from pipeline.kernels.fused_int8 import ROW_CODES_CPP

if TYPE_CHECKING:  # imported by `python -m pipeline.kernels.compiled`, which finds a build without torch
    import torch

# Output channels per packed block (one AVX-512 register of int32 sums) and inputs per lane product.
BLOCK, QUAD = 16, 4
# Output channels per task: the packed weight's rows are padded to a multiple of it.
GROUP = 64

# int8-dynamic's op around a kernel's `Code`, `quantize_row`, `any_rows` and `exact_sum` (OP_FUNCTION, OP: the op's
# C++ function and its name, defined before): this kernel's and pipeline.kernels.avx2_int8's, one text.
LINEAR_CPP = r'''
// (n, k) float32 rows x a weight packed by pipeline.kernels.vnni_int8.pack -> (n, out) float32.
torch::Tensor OP_FUNCTION(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& offsets,
                          const torch::Tensor& scale, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, OP ": 2-d float32 rows");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kChar && packed.is_contiguous()
              && packed.size(2) == GROUP / BLOCK && packed.size(3) == BLOCK && packed.size(4) == QUAD,
              OP ": a weight packed by vnni_int8.pack");
  const int64_t channels = scale.numel(), padded_out = packed.size(0) * GROUP, quads = packed.size(1);
  const int64_t k = x.size(1), padded = quads * QUAD, n = x.size(0);
  TORCH_CHECK(k <= padded && padded - k < QUAD, OP ": rows of ", padded - QUAD + 1, " to ", padded,
              " values, not ", k);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && channels <= padded_out
              && padded_out - channels < GROUP, OP ": one float32 scale per output channel");
  TORCH_CHECK(offsets.scalar_type() == at::kInt && offsets.is_contiguous() && offsets.numel() == padded_out,
              OP ": one int32 offset per packed channel");
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == channels,
                OP ": a float32 bias of one value per output channel");
  const auto xc = x.contiguous();
  auto out = torch::empty({n, channels}, xc.options());
  if (n == 0) return out;
  std::vector<Code> codes(n * padded);
  std::vector<float> row_scale(n);
  const float* src = xc.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row_scale[r] = quantize_row(src + r * k, k, padded, codes.data() + r * padded);
  });
  const int8_t* w = packed.data_ptr<int8_t>();
  const int32_t* off = offsets.data_ptr<int32_t>();
  const float* cs = scale.data_ptr<float>();
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* dst = out.data_ptr<float>();
  const int64_t groups = padded_out / GROUP;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    alignas(64) int32_t acc[ROWS * GROUP];
    for (int64_t g = begin; g < end; ++g) {
      const int8_t* wg = w + g * GROUP * padded;
      const int64_t c0 = g * GROUP, c1 = std::min(channels, c0 + GROUP);
      for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, n - r0);
        any_rows(rows, codes.data() + r0 * padded, padded, wg, quads, acc);
        for (int64_t r = 0; r < rows; ++r) {
          const float rs = row_scale[r0 + r];
          float* o = dst + (r0 + r) * channels;
          const int32_t* a = acc + r * GROUP;
          // float(sum) x channel scale, x row scale, + bias: each rounded on its own (no contraction)
          if (b) { for (int64_t c = c0; c < c1; ++c) { const float v = static_cast<float>(exact_sum(a[c - c0], off[c])) * cs[c] * rs; o[c] = v + b[c]; } }
          else { for (int64_t c = c0; c < c1; ++c) o[c] = static_cast<float>(exact_sum(a[c - c0], off[c])) * cs[c] * rs; }
        }
      }
    }
  });
  return out;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def(OP "(Tensor x, Tensor packed, Tensor offsets, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) { m.impl(OP, &OP_FUNCTION); }
'''

# A group's sums for any row count (up to ROWS) from a kernel's `sums<R, B>` over the B = GROUP / BLOCK blocks of a
# group (R rows of X values `stride` apart, W weights, `steps` input steps, S sums out) and its PASS_ROWS (all defined
# before): this kernel's and pipeline.kernels.avx512_bf16's, one text.
GROUP_ROWS_CPP = r'''
// One group for `rows` (<= ROWS) rows, PASS_ROWS rows a pass over the group's GROUP / BLOCK blocks (their sums held
// in registers); past PASS_ROWS rows the second pass reads the group's weights again from the cache.
template <int R, typename X, typename W, typename S>
inline void group_sums(const X* x, int64_t stride, const W* w, int64_t steps, S* out) {
  constexpr int BLOCKS = GROUP / BLOCK;
  if constexpr (R <= PASS_ROWS) {
    sums<R, BLOCKS>(x, stride, w, steps, out);
  } else {
    sums<PASS_ROWS, BLOCKS>(x, stride, w, steps, out);
    sums<R - PASS_ROWS, BLOCKS>(x + PASS_ROWS * stride, stride, w, steps, out + PASS_ROWS * GROUP);
  }
}

template <typename X, typename W, typename S>
void any_rows(int64_t rows, const X* x, int64_t stride, const W* w, int64_t steps, S* out) {
  switch (rows) {
    case 1: group_sums<1>(x, stride, w, steps, out); break;
    case 2: group_sums<2>(x, stride, w, steps, out); break;
    case 3: group_sums<3>(x, stride, w, steps, out); break;
    case 4: group_sums<4>(x, stride, w, steps, out); break;
    case 5: group_sums<5>(x, stride, w, steps, out); break;
    case 6: group_sums<6>(x, stride, w, steps, out); break;
    case 7: group_sums<7>(x, stride, w, steps, out); break;
    default: group_sums<8>(x, stride, w, steps, out);
  }
}
'''

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
''' + ROW_CODES_CPP + r'''
namespace {

constexpr int64_t BLOCK = 16, QUAD = 4, GROUP = 64, ROWS = 8;
// Six rows' sums of four blocks a pass: 24 of the 32 registers. Against four a pass: 0.86-0.94x at five and six
// rows, level at seven and eight (docs/performance.md, section 26).
constexpr int PASS_ROWS = 6;
// No software prefetch: a group's weights are one run of memory, which the hardware's prefetcher follows; asking
// for them ahead as well cost 1.08-1.24x at four and eight rows (docs/performance.md, section 25).

using Code = uint8_t;  // a row's codes + 128: vpdpbusd's first operand is unsigned

// The sum of code x weight from the kernel's sum of (code + 128) x weight and the channel's offset, 128 x its weights.
inline int32_t exact_sum(int32_t shifted, int32_t offset) { return shifted - offset; }

// One row's scale and its codes + 128.
float quantize_row(const float* row, int64_t k, int64_t padded, uint8_t* out) {
  const float s = row_scale(row, k);
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<uint8_t>(row_code(row[j], s) + 128.0f);
  std::fill(out + k, out + padded, uint8_t(128));  // code 0 against a zero weight
  return s;
}

// Sums of R rows of codes (stride `stride`) against B packed blocks starting at `w`: a group's blocks lie
// interleaved, quad by quad (GROUP x QUAD bytes a quad), so a group's weights are one run of memory.
template <int R, int B>
inline void sums(const uint8_t* codes, int64_t stride, const int8_t* w, int64_t quads, int32_t* out) {
  __m512i acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_si512();
  for (int64_t q = 0; q < quads; ++q) {
    __m512i wv[B];
    const int8_t* quad = w + q * GROUP * QUAD;
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      const int8_t* line = quad + b * BLOCK * QUAD;
      wv[b] = _mm512_loadu_si512(line);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, codes + r * stride + q * QUAD, sizeof four);
      const __m512i a = _mm512_set1_epi32(four);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], a, wv[b]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) _mm512_storeu_si512(out + r * GROUP + b * BLOCK, acc[r][b]);
}

''' + GROUP_ROWS_CPP + r'''
}  // namespace

#define OP_FUNCTION vnni_linear
#define OP "vnni_linear"
''' + LINEAR_CPP
# The VNNI kernels' flags (this one's and pipeline.kernels.vnni_int4's). -ffp-contract=off: the float products and
# sums round one at a time, as torch's separate ops do.
CFLAGS = ["-O3", "-std=c++17", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-ffp-contract=off", "-fno-fast-math",
          "-fopenmp"]
CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_vnni"})
EXTENSION = CompiledExtension("rag_vnni_int8", _SOURCE, ["vnni_linear"], CFLAGS, CPU_FLAGS, ldflags=("-fopenmp",))


def pack(qweight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An (out, in) int8 weight as the kernel reads it: (out padded to GROUP / GROUP, in padded to QUAD / QUAD,
    GROUP / BLOCK, BLOCK, QUAD) int8, a group's four blocks interleaved quad by quad (one run of memory a task),
    zeros in the padding, and each packed channel's 128 x its weights' sum (int32): what the codes' + 128 adds
    to its sums. The packed weight lies in 2 MB pages where :mod:`~pipeline.kernels.huge_pages` gives them."""
    import torch
    out, k = qweight.shape
    padded = torch.zeros(-(-out // GROUP) * GROUP, -(-k // QUAD) * QUAD, dtype=torch.int8)
    padded[:out, :k] = qweight
    offsets = padded.sum(dim=1, dtype=torch.int32).mul_(128)
    groups = padded.view(padded.shape[0] // GROUP, GROUP // BLOCK, BLOCK, padded.shape[1] // QUAD, QUAD)
    return huge_pages.contiguous(groups.permute(0, 3, 1, 2, 4)), offsets  # streamed whole at every decode step


def unpack(packed: torch.Tensor, out: int, k: int) -> torch.Tensor:
    """:func:`pack`'s (out, in) int8 weight back."""
    return packed.permute(0, 2, 3, 1, 4).reshape(packed.shape[0] * GROUP, packed.shape[1] * QUAD)[:out, :k].contiguous()
