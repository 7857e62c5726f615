"""int4-dynamic's product: group-wise 4-bit weights x int8 activations, exact integer sums per group.

A decode step reads every weight once; at a few rows the product is bound by the bytes it reads. 4-bit
weights are half of int8's bytes, but a float product must widen every weight before it multiplies (torch's
packed int4 kernel, int4-weight: 1.8-4.2x its memory floor on an AVX-512 EPYC), which costs more than the
read. Quantizing the activations as int8-dynamic does (one scale per row) lets VNNI's ``vpdpbusd`` multiply
64 codes an instruction instead: weights' codes (0..15, unsigned) x the row's codes (-127..127, signed).

The arithmetic, a weight being (code - 8) x scale + offset in its group of `group` inputs (the 4-bit codes,
scales and offsets of :func:`pipeline.kernels.int4.quantize_groups`, the same as int4-weight's, kept in bfloat16 as
made and widened to float32 exactly):

* each row quantized as pipeline.kernels.fused_int8 does (scale max|x| clamped to 1e-12, / 127; codes
  x / scale rounded half to even), and each group's sum Q of its codes;
* per group, the int32 sum S of code x row code (exact: at most 15 x 127 x 256), then in float32, each
  operation rounded on its own: acc += scale x float(S - 8 Q) + offset x float(Q), groups in input order;
* the output acc x row scale (+ bias).

Integer sums are exact in any order and the float steps run in one fixed order per output, so a row's
bits do not depend on the row count, the rows beside it, the thread count or the CPU; the kernel
(AVX-512 VNNI, a task per 64 output channels) and :func:`reference_product` (torch's ops, any CPU: its
float32 matmuls of small integers are exact in any order too) give the same bits
(tests/unit/test_vnni_int4.py). It is registered with torch's dispatcher (``EXTENSION.registered("vnni_int4_linear")``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.kernels import huge_pages, vnni_int8
from pipeline.kernels.compiled import CompiledExtension
from pipeline.kernels.fused_int8 import ROW_CODES_CPP

if TYPE_CHECKING:  # imported by `python -m pipeline.kernels.compiled`, which finds a build without torch
    import torch

# Output channels per packed block (one AVX-512 register of int32 sums), inputs per packed byte row (two
# quads of four: one in the low nibbles, one in the high), output channels per task (the padding unit).
BLOCK, PAIR, GROUP = 16, 8, 64
# Output columns the torch path computes at a time: bounds its (groups, rows, columns) sums.
_REFERENCE_COLUMNS = 8192

# int4-dynamic's row quantization (one scale a row, signed codes, each group's sum of them) and its op around a
# kernel's `any_rows` (OP_FUNCTION, OP: the op's C++ function and its name, defined before): this kernel's
# and pipeline.kernels.avx2_int4's, one text.
QUANTIZE_ROW_CPP = r'''
// One row's scale, its codes (signed) and each group's sum of them.
inline float quantize_row(const float* row, int64_t k, int64_t group, int8_t* out, int32_t* group_sums) {
  const float s = row_scale(row, k);
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int8_t>(row_code(row[j], s));
  for (int64_t g = 0; g < k / group; ++g) {
    int32_t sum = 0;
    for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += out[j];
    group_sums[g] = sum;
  }
  return s;
}
'''
LINEAR_CPP = r'''
// (n, k) float32 rows x a weight packed by pipeline.kernels.vnni_int4.pack -> (n, channels) float32.
torch::Tensor OP_FUNCTION(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& params,
                          int64_t channels, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, OP ": 2-d float32 rows");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kByte && packed.is_contiguous()
              && packed.size(2) == BLOCKS && packed.size(3) == BLOCK && packed.size(4) == PAIR / 2,
              OP ": a weight packed by vnni_int4.pack");
  const int64_t tasks = packed.size(0), pairs = packed.size(1), k = pairs * PAIR, n = x.size(0);
  TORCH_CHECK(x.size(1) == k, OP ": rows of ", k, " values, not ", x.size(1));
  TORCH_CHECK(params.dim() == 5 && params.scalar_type() == at::kBFloat16 && params.is_contiguous()
              && params.size(0) == tasks && params.size(2) == BLOCKS && params.size(3) == 2 && params.size(4) == BLOCK
              && params.size(1) >= 1 && k % params.size(1) == 0 && (k / params.size(1)) % PAIR == 0,
              OP ": bfloat16 (tasks, groups, 4, 2, 16) scales and offsets from vnni_int4.pack");
  const int64_t groups = params.size(1), group = k / groups, group_pairs = group / PAIR;
  TORCH_CHECK(channels >= 1 && channels <= tasks * GROUP && tasks * GROUP - channels < GROUP,
              OP ": ", channels, " channels do not fit ", tasks, " packed tasks of ", GROUP);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == channels,
                OP ": a float32 bias of one value per output channel");
  const auto xc = x.contiguous();
  auto out = torch::empty({n, channels}, xc.options());
  if (n == 0) return out;
  std::vector<int8_t> codes(n * k);
  std::vector<int32_t> qsums(n * groups);
  std::vector<float> row_scale(n);
  const float* src = xc.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      row_scale[r] = quantize_row(src + r * k, k, group, codes.data() + r * k, qsums.data() + r * groups);
  });
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const uint16_t* pr = reinterpret_cast<const uint16_t*>(params.data_ptr<at::BFloat16>());
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[ROWS * GROUP];
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* wt = w + t * pairs * GROUP * PAIR / 2;
      const uint16_t* pt = pr + t * groups * BLOCKS * 2 * BLOCK;
      const int64_t c0 = t * GROUP, c1 = std::min(channels, c0 + GROUP);
      // Eight rows at a time: past the first eight, the task's weights come from the core's cache.
      for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, n - r0);
        std::fill(acc, acc + ROWS * GROUP, 0.0f);
        any_rows(rows, codes.data() + r0 * k, k, qsums.data() + r0 * groups, groups, wt, pt, group_pairs, acc);
        for (int64_t r = 0; r < rows; ++r) {
          const float rs = row_scale[r0 + r];
          float* o = dst + (r0 + r) * channels;
          const float* a = acc + r * GROUP;
          // x row scale, + bias: each rounded on its own (no contraction)
          if (b) { for (int64_t c = c0; c < c1; ++c) { const float v = a[c - c0] * rs; o[c] = v + b[c]; } }
          else { for (int64_t c = c0; c < c1; ++c) o[c] = a[c - c0] * rs; }
        }
      }
    }
  });
  return out;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def(OP "(Tensor x, Tensor packed, Tensor params, int channels, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) { m.impl(OP, &OP_FUNCTION); }
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
''' + ROW_CODES_CPP + QUANTIZE_ROW_CPP + r'''
namespace {

constexpr int64_t BLOCK = 16, PAIR = 8, GROUP = 64, BLOCKS = GROUP / BLOCK, ROWS = 8;
// Bytes ahead of each load asked for, at every row count: a task's weights are one run of memory, and between
// its loads the unpacking and dot products hold the hardware's prefetcher back (the decode step at one row 0.90-0.94x
// with the requests, level from two rows; 4 KB ahead beat 0.5-2 KB at four and eight rows).
constexpr int64_t PREFETCH = 4096;

// 16 bfloat16 values as float32 (exact: a bfloat16 is a float32's upper half).
inline __m512 widened(const uint16_t* v) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// One task's 64 channels (four blocks of 16, their bytes interleaved by input pair: one stream), blocks
// [B0, B0 + B), for R rows: the float sums over every group into `acc` (R x GROUP floats).
template <int R, int B = BLOCKS, int B0 = 0>
inline void task(const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups, const uint8_t* w,
                 const uint16_t* params, int64_t group_pairs, float* acc, int64_t g0 = 0, int64_t g1 = -1) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = g0; g < (g1 < 0 ? groups : g1); ++g) {
    __m512i sums[R][B];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) sums[r][b] = _mm512_setzero_si512();
    for (int64_t p = g * group_pairs; p < (g + 1) * group_pairs; ++p) {
      __m512i lo[B], hi[B];
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        const uint8_t* line = w + (p * BLOCKS + B0 + b) * BLOCK * PAIR / 2;
        _mm_prefetch(reinterpret_cast<const char*>(line) + PREFETCH, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(line);
        lo[b] = _mm512_and_si512(v, low);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t first, second;
        std::memcpy(&first, codes + r * stride + p * PAIR, sizeof first);
        std::memcpy(&second, codes + r * stride + p * PAIR + 4, sizeof second);
        const __m512i a = _mm512_set1_epi32(first), c = _mm512_set1_epi32(second);
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          sums[r][b] = _mm512_dpbusd_epi32(sums[r][b], lo[b], a);
          sums[r][b] = _mm512_dpbusd_epi32(sums[r][b], hi[b], c);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int32_t q = qsums[r * groups + g];
      const __m512i eight_q = _mm512_set1_epi32(8 * q);
      const __m512 qf = _mm512_set1_ps(static_cast<float>(q));
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        const uint16_t* scale = params + (g * BLOCKS + B0 + b) * 2 * BLOCK;
        const __m512 x = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r][b], eight_q));
        const __m512 term = _mm512_add_ps(_mm512_mul_ps(widened(scale), x), _mm512_mul_ps(widened(scale + BLOCK), qf));
        float* a = acc + r * GROUP + (B0 + b) * BLOCK;
        _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), term));
      }
    }
  }
}

// Per group, its first two blocks for all R rows, then its last two: each weight nibble split once for eight
// rows, not once per four, with eight rows x two blocks of sums in registers (x four would not fit). A task's
// products at eight rows 0.92-0.93x the two passes of four.
template <int R>
inline void halves(const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups, const uint8_t* w,
                   const uint16_t* params, int64_t group_pairs, float* acc) {
  for (int64_t g = 0; g < groups; ++g) {
    task<R, 2, 0>(codes, stride, qsums, groups, w, params, group_pairs, acc, g, g + 1);
    task<R, 2, 2>(codes, stride, qsums, groups, w, params, group_pairs, acc, g, g + 1);
  }
}

void any_rows(int64_t rows, const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups,
              const uint8_t* w, const uint16_t* params, int64_t group_pairs, float* acc) {
  switch (rows) {
    case 1: task<1>(codes, stride, qsums, groups, w, params, group_pairs, acc); break;
    case 2: task<2>(codes, stride, qsums, groups, w, params, group_pairs, acc); break;
    case 3: task<3>(codes, stride, qsums, groups, w, params, group_pairs, acc); break;
    case 4: task<4>(codes, stride, qsums, groups, w, params, group_pairs, acc); break;
    default:
      if (rows >= ROWS) {  // eight rows in one pass over each group's blocks, two at a time
        halves<ROWS>(codes, stride, qsums, groups, w, params, group_pairs, acc);
      } else {  // five to seven: four, then the rest (at these counts the halves were 1.02-1.03x slower)
        task<4>(codes, stride, qsums, groups, w, params, group_pairs, acc);
        any_rows(rows - 4, codes + 4 * stride, stride, qsums + 4 * groups, groups, w, params, group_pairs,
                 acc + 4 * GROUP);
      }
  }
}

}  // namespace

#define OP_FUNCTION vnni_int4_linear
#define OP "vnni_int4_linear"
''' + LINEAR_CPP
# vnni_int8's flags: each multiply and add rounds on its own, as torch's separate ops (reference_product) do.
EXTENSION = CompiledExtension("rag_vnni_int4", _SOURCE, ["vnni_int4_linear"], vnni_int8.CFLAGS, vnni_int8.CPU_FLAGS,
                              ldflags=("-fopenmp",))


def pack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) codes 0..15 and (out, groups) float32 scales and offsets, each a bfloat16 value (quantize_groups'
    are: the kernel keeps them in bfloat16, half the bytes; ValueError otherwise) -> the kernel's (packed, params), a task
    (GROUP channels, four blocks of BLOCK) in one run of memory each: packed (tasks, in / PAIR, 4, BLOCK,
    PAIR / 2) uint8, where byte (t, p, b, c, i) holds channel t x 64 + b x 16 + c's code at input 8p + i in
    its low nibble and at 8p + 4 + i in its high one; params (tasks, groups, 4, 2, BLOCK) bfloat16, each
    block's 16 scales then 16 offsets per group. Padded channels get code 0 and a zero scale and offset. Both
    lie in 2 MB pages where :mod:`~pipeline.kernels.huge_pages` gives them."""
    import torch
    for name, values in (("scale", scale), ("offset", offset)):
        if not torch.equal(values.to(torch.bfloat16).float(), values):
            raise ValueError(f"vnni_int4.pack: every {name} must be a bfloat16 value (quantize_groups' are)")
    out, k = codes.shape
    rows = -(-out // GROUP) * GROUP
    padded = torch.zeros(rows, k, dtype=torch.uint8)
    padded[:out] = codes.to(torch.uint8)
    # (task, block, channel, pair, half, i) -> (task, pair, block, channel, half, i)
    halves = padded.view(rows // GROUP, GROUP // BLOCK, BLOCK, k // PAIR, 2, PAIR // 2).permute(0, 3, 1, 2, 4, 5)
    packed = huge_pages.contiguous(halves[..., 0, :] | (halves[..., 1, :] << 4))
    params = torch.zeros(rows, scale.shape[1], 2, dtype=torch.bfloat16)
    params[:out, :, 0], params[:out, :, 1] = scale, offset
    # (task, block, channel, group, 2) -> (task, group, block, 2, channel)
    params = huge_pages.contiguous(params.view(rows // GROUP, GROUP // BLOCK, BLOCK, -1, 2).permute(0, 3, 1, 4, 2))
    return packed, params


def unpack(packed: torch.Tensor, params: torch.Tensor, out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pack`'s (codes, scale, offset) back: (out, in) uint8 codes, (out, groups) float32 each."""
    import torch
    tasks, pairs = packed.shape[:2]
    halves = torch.stack([packed & 0x0F, packed >> 4], dim=4)  # (task, pair, block, channel, half, i)
    codes = halves.permute(0, 2, 3, 1, 4, 5).reshape(tasks * GROUP, pairs * PAIR)[:out]
    per_channel = params.permute(0, 2, 4, 1, 3).reshape(tasks * GROUP, params.shape[1], 2)[:out].float()
    return codes.contiguous(), per_channel[..., 0].contiguous(), per_channel[..., 1].contiguous()


def reference_product(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's arithmetic in torch's ops, any CPU: (n, in) float32 rows x (out, in) codes 0..15 with
    (out, groups) float32 scales and offsets -> (n, out) float32, the kernel's bits. A group's integer sums
    run as float32 matmuls: every product and partial sum is an integer below 2^24, exact in any order."""
    import torch

    from pipeline.kernels.int8 import row_codes
    n, k = x.shape
    out, groups = scale.shape
    width = k // groups
    row_code, row_scale = row_codes(x.float())
    grouped = row_code.view(n, groups, width).transpose(0, 1)  # (groups, n, width), float codes
    qsum = grouped.sum(dim=2, keepdim=True)  # (groups, n, 1): integers, exact
    result = torch.empty(n, out, dtype=torch.float32)
    for c0 in range(0, out, _REFERENCE_COLUMNS):
        c1 = min(out, c0 + _REFERENCE_COLUMNS)
        weights = codes[c0:c1].float().view(c1 - c0, groups, width).permute(1, 2, 0)  # (groups, width, cols)
        sums = torch.bmm(grouped, weights)  # (groups, n, cols)
        acc = torch.zeros(n, c1 - c0)
        for g in range(groups):
            acc = acc + (scale[c0:c1, g] * (sums[g] - 8 * qsum[g]) + offset[c0:c1, g] * qsum[g])
        result[:, c0:c1] = acc * row_scale
    return result if bias is None else result + bias
