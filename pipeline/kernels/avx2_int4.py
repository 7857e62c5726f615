"""int4-dynamic's product on a CPU with AVX2 and no AVX-512 VNNI: pipeline.kernels.vnni_int4's arithmetic and bits.

The same weight (:func:`pipeline.kernels.vnni_int4.pack`'s 4-bit codes and bfloat16 group parameters), the same
row codes and the same float steps; only the integer products differ in how they are taken. A weight's code is
0..15, so ``vpmaddubsw`` (unsigned code x signed row code, adjacent pairs summed in 16 bits) cannot saturate: a
pair is at most 2 x 15 x 127 = 3,810, a low and a high nibble's pairs added at most 7,620; ``vpmaddwd`` by ones
takes them to 32 bits. The per-group int32 sums are exact, so every float step after them (``scale x float(S -
8 Q) + offset x float(Q)``, groups in input order, each operation rounded on its own: -ffp-contract=off) gives
vnni_int4's and :func:`~pipeline.kernels.vnni_int4.reference_product`'s bits, for every row at any row count
(tests/unit/test_vnni_int4.py runs its cases on both kernels).

Eight channels a 256-bit register: a task's 64 channels are eight registers, summed for up to four rows at a time
(as many registers a pass as the sums fit, the later passes over a group's weights from the cache). Built with
``-mavx2`` alone; :class:`pipeline.kernels.int4.Int4DynamicLinear` takes it where vnni_int4 is not usable.
Registered with torch's dispatcher (``EXTENSION.registered("avx2_int4_linear")``).
"""
from __future__ import annotations

from pipeline.kernels import avx2_int8
from pipeline.kernels.compiled import CompiledExtension
from pipeline.kernels.fused_int8 import ROW_CODES_CPP

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

// vnni_int4.pack's layout: per task (GROUP channels), per pair of four-input quads, BLOCKS blocks of BLOCK
// channels x PAIR / 2 bytes; register h (of HALVES) holds channels 8h.. of the task.
constexpr int64_t BLOCK = 16, PAIR = 8, GROUP = 64, BLOCKS = GROUP / BLOCK, HALVES = GROUP / 8, ROWS = 8;

// 8 bfloat16 values as float32 (exact: a bfloat16 is a float32's upper half).
inline __m256 widened(const uint16_t* v) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// One row's scale, its codes (signed) and each group's sum of them: vnni_int4's.
float quantize_row(const float* row, int64_t k, int64_t group, int8_t* out, int32_t* group_sums) {
  const float s = row_scale(row, k);
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int8_t>(row_code(row[j], s));
  for (int64_t g = 0; g < k / group; ++g) {
    int32_t sum = 0;
    for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += out[j];
    group_sums[g] = sum;
  }
  return s;
}

// R rows' float sums over every group for registers [first, first + H) of a task into `acc` (R x GROUP floats).
template <int R, int H>
inline void task(const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups, const uint8_t* w,
                 const uint16_t* params, int64_t group_pairs, int first, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sums[R][H];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) sums[r][h] = _mm256_setzero_si256();
    for (int64_t p = g * group_pairs; p < (g + 1) * group_pairs; ++p) {
      const uint8_t* pair = w + p * GROUP * PAIR / 2 + first * 32;
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair + h * 32));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          int32_t quads[2];
          std::memcpy(quads, codes + r * stride + p * PAIR, sizeof quads);
          // |each 16-bit lane| <= 2 x 15 x 127 per nibble, 7,620 for both: no saturation
          const __m256i both = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(quads[0])),
                                                _mm256_maddubs_epi16(hi, _mm256_set1_epi32(quads[1])));
          sums[r][h] = _mm256_add_epi32(sums[r][h], _mm256_madd_epi16(both, ones));
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int32_t q = qsums[r * groups + g];
      const __m256i eight_q = _mm256_set1_epi32(8 * q);
      const __m256 qf = _mm256_set1_ps(static_cast<float>(q));
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const int c = first + h;  // register: block c / 2, its channels 8 (c % 2)..
        const uint16_t* scale = params + (g * BLOCKS + c / 2) * 2 * BLOCK + (c % 2) * 8;
        const __m256 x = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][h], eight_q));
        const __m256 term = _mm256_add_ps(_mm256_mul_ps(widened(scale), x), _mm256_mul_ps(widened(scale + BLOCK), qf));
        float* a = acc + r * GROUP + c * 8;
        _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), term));
      }
    }
  }
}

// R (<= 4) rows: as many registers a pass as R x H <= 8 sums allow, passes until the task's eight are summed.
template <int R>
inline void passes(const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups, const uint8_t* w,
                   const uint16_t* params, int64_t group_pairs, float* acc) {
  constexpr int H = R == 1 ? 8 : R == 2 ? 4 : 2;
  for (int first = 0; first < HALVES; first += H)
    task<R, H>(codes, stride, qsums, groups, w, params, group_pairs, first, acc);
}

void any_rows(int64_t rows, const int8_t* codes, int64_t stride, const int32_t* qsums, int64_t groups,
              const uint8_t* w, const uint16_t* params, int64_t group_pairs, float* acc) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const int8_t* c = codes + r0 * stride;
    const int32_t* q = qsums + r0 * groups;
    float* a = acc + r0 * GROUP;
    switch (std::min<int64_t>(4, rows - r0)) {
      case 1: passes<1>(c, stride, q, groups, w, params, group_pairs, a); break;
      case 2: passes<2>(c, stride, q, groups, w, params, group_pairs, a); break;
      case 3: passes<3>(c, stride, q, groups, w, params, group_pairs, a); break;
      default: passes<4>(c, stride, q, groups, w, params, group_pairs, a);
    }
  }
}

}  // namespace

// (n, k) float32 rows x a weight packed by pipeline.kernels.vnni_int4.pack -> (n, channels) float32.
torch::Tensor avx2_int4_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& params,
                               int64_t channels, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "avx2_int4_linear: 2-d float32 rows");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kByte && packed.is_contiguous()
              && packed.size(2) == BLOCKS && packed.size(3) == BLOCK && packed.size(4) == PAIR / 2,
              "avx2_int4_linear: a weight packed by vnni_int4.pack");
  const int64_t tasks = packed.size(0), pairs = packed.size(1), k = pairs * PAIR, n = x.size(0);
  TORCH_CHECK(x.size(1) == k, "avx2_int4_linear: rows of ", k, " values, not ", x.size(1));
  TORCH_CHECK(params.dim() == 5 && params.scalar_type() == at::kBFloat16 && params.is_contiguous()
              && params.size(0) == tasks && params.size(2) == BLOCKS && params.size(3) == 2 && params.size(4) == BLOCK
              && params.size(1) >= 1 && k % params.size(1) == 0 && (k / params.size(1)) % PAIR == 0,
              "avx2_int4_linear: bfloat16 (tasks, groups, 4, 2, 16) scales and offsets from vnni_int4.pack");
  const int64_t groups = params.size(1), group = k / groups, group_pairs = group / PAIR;
  TORCH_CHECK(channels >= 1 && channels <= tasks * GROUP && tasks * GROUP - channels < GROUP,
              "avx2_int4_linear: ", channels, " channels do not fit ", tasks, " packed tasks of ", GROUP);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == channels,
                "avx2_int4_linear: a float32 bias of one value per output channel");
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
    alignas(32) float acc[ROWS * GROUP];
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* wt = w + t * pairs * GROUP * PAIR / 2;
      const uint16_t* pt = pr + t * groups * BLOCKS * 2 * BLOCK;
      const int64_t c0 = t * GROUP, c1 = std::min(channels, c0 + GROUP);
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
  m.def("avx2_int4_linear(Tensor x, Tensor packed, Tensor params, int channels, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) { m.impl("avx2_int4_linear", &avx2_int4_linear); }
'''
EXTENSION = CompiledExtension("rag_avx2_int4", _SOURCE, ["avx2_int4_linear"], avx2_int8.CFLAGS, frozenset({"avx2"}),
                              ldflags=("-fopenmp",))
