"""A bfloat16 Linear's product on a CPU with AVX-512 BF16, each row's sum in one fixed order: row-invariant by
construction, and at a decode step's few rows read at the memory's pace.

oneDNN's bfloat16 matmul (what :class:`~pipeline.kernels.batch_invariance.RowInvariantLinear` calls) gives a row the
same bits among 2 to thousands of rows only as measured on the kernels it picks (not its AMX ones, nor one row), and
at a decode step's one to eight rows it streams its packed weight at 11-16 GB/s where the machine reads 40
(docs/performance.md, section 25). Here:

* the weight packed once in groups of 48 output channels, each group one run of memory: for every pair of inputs,
  three blocks of 16 channels x 2 inputs (one AVX-512 register each);
* up to eight rows in one pass over a group (8 x 3 sums: 24 of the 32 registers), so at a decode step's eight rows
  the dot products overlap the weights' stream instead of a second pass over them following it;
* each row's float32 sums by ``vdpbf16ps`` (two bfloat16 products a lane added to the lane's sum; products of
  bfloat16s are exact in float32), input pair after input pair from the first: the same operations in the same
  order for a row alone and among any number of rows, at any thread count (threads split output channels);
* the sum + bias (float32) rounded once to bfloat16, to nearest even, as oneDNN's output is.

Registered with torch's dispatcher (``EXTENSION.registered("bf16_linear")``): profilers see it, and the one-call
decode layers (pipeline.kernels.decode_layers) call it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.kernels import huge_pages
from pipeline.kernels.compiled import CompiledExtension
from pipeline.kernels.vnni_int8 import GROUP_ROWS_CPP

if TYPE_CHECKING:  # imported by `python -m pipeline.kernels.compiled`, which finds a build without torch
    import torch

# Output channels per packed block (one AVX-512 register of float32 sums), inputs per lane product, channels per task.
BLOCK, PAIR, GROUP = 16, 2, 48

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t BLOCK = 16, PAIR = 2, GROUP = 48, ROWS = 8;
// Every row in one pass: 8 x 3 sums in registers. Against groups of 64 read 4 rows a pass: 0.83-0.93x at eight rows,
// level at one (docs/performance.md, section 26).
constexpr int PASS_ROWS = 8;

// Sums of R rows (bfloat16, `stride` apart) against B blocks of a group: the group's blocks lie interleaved pair by
// pair (GROUP x PAIR values a pair), one run of memory.
template <int R, int B>
inline void sums(const uint16_t* x, int64_t stride, const uint16_t* w, int64_t pairs, float* out) {
  __m512 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i wv[B];
    const uint16_t* line = w + p * GROUP * PAIR;
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) wv[b] = _mm512_loadu_si512(line + b * BLOCK * PAIR);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t two;
      std::memcpy(&two, x + r * stride + p * PAIR, sizeof two);
      const __m512i a = _mm512_set1_epi32(two);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], (__m512bh)a, (__m512bh)wv[b]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(out + r * GROUP + b * BLOCK, acc[r][b]);
}

''' + GROUP_ROWS_CPP + r'''
}  // namespace

// (n, k) bfloat16 rows x a weight packed by pipeline.kernels.avx512_bf16.pack -> (n, channels) bfloat16.
torch::Tensor bf16_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t channels,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "bf16_linear: 2-d bfloat16 rows");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous()
              && packed.size(2) == GROUP / BLOCK && packed.size(3) == BLOCK && packed.size(4) == PAIR,
              "bf16_linear: a weight packed by avx512_bf16.pack");
  const int64_t padded_out = packed.size(0) * GROUP, pairs = packed.size(1), padded = pairs * PAIR;
  const int64_t k = x.size(1), n = x.size(0);
  TORCH_CHECK(k <= padded && padded - k < PAIR, "bf16_linear: rows of ", padded - PAIR + 1, " to ", padded,
              " values, not ", k);
  TORCH_CHECK(channels <= padded_out && padded_out - channels < GROUP && channels > 0,
              "bf16_linear: ", channels, " output channels from a weight packed for ", padded_out);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->is_contiguous() && bias->numel() == channels,
                "bf16_linear: a bfloat16 bias of one value per output channel");
  // rows of an odd width get a zero beside their last value (against the packed weight's zero)
  const auto xc = k == padded ? x.contiguous() : at::constant_pad_nd(x, {0, padded - k}).contiguous();
  auto out = torch::empty({n, channels}, x.options());
  if (n == 0) return out;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const at::BFloat16* b = bias.has_value() ? bias->data_ptr<at::BFloat16>() : nullptr;
  at::BFloat16* dst = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, padded_out / GROUP, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[ROWS * GROUP];
    for (int64_t g = begin; g < end; ++g) {
      const uint16_t* wg = w + g * GROUP * padded;
      const int64_t c0 = g * GROUP, c1 = std::min(channels, c0 + GROUP);
      for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, n - r0);
        any_rows(rows, src + r0 * padded, padded, wg, pairs, acc);
        for (int64_t r = 0; r < rows; ++r) {
          at::BFloat16* o = dst + (r0 + r) * channels;
          const float* a = acc + r * GROUP;
          // the sum + bias in float32, rounded once to bfloat16 (to nearest even)
          if (b) { for (int64_t c = c0; c < c1; ++c) o[c] = at::BFloat16(a[c - c0] + static_cast<float>(b[c])); }
          else { for (int64_t c = c0; c < c1; ++c) o[c] = at::BFloat16(a[c - c0]); }
        }
      }
    }
  });
  return out;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def("bf16_linear(Tensor x, Tensor packed, int channels, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) { m.impl("bf16_linear", &bf16_linear); }
'''
# -ffp-contract=off: the bias is added to the finished sum, one rounding, as written.
CFLAGS = ["-O3", "-std=c++17", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-ffp-contract=off", "-fno-fast-math",
          "-fopenmp"]
CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_bf16"})
EXTENSION = CompiledExtension("rag_avx512_bf16", _SOURCE, ["bf16_linear"], CFLAGS, CPU_FLAGS, ldflags=("-fopenmp",))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """An (out, in) bfloat16 weight as the kernel reads it: (out padded to GROUP / GROUP, in padded to PAIR / PAIR,
    GROUP / BLOCK, BLOCK, PAIR), a group's three blocks interleaved pair by pair, zeros in the padding; in 2 MB
    pages where :mod:`~pipeline.kernels.huge_pages` gives them."""
    import torch
    out, k = weight.shape
    padded = torch.zeros(-(-out // GROUP) * GROUP, -(-k // PAIR) * PAIR, dtype=torch.bfloat16)
    padded[:out, :k] = weight
    groups = padded.view(padded.shape[0] // GROUP, GROUP // BLOCK, BLOCK, padded.shape[1] // PAIR, PAIR)
    return huge_pages.contiguous(groups.permute(0, 3, 1, 2, 4))  # streamed whole at every decode step


def unpack(packed: torch.Tensor, out: int, k: int) -> torch.Tensor:
    """:func:`pack`'s (out, in) bfloat16 weight back."""
    return packed.permute(0, 2, 3, 1, 4).reshape(packed.shape[0] * GROUP, packed.shape[1] * PAIR)[:out, :k].contiguous()
