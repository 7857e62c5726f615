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
from pipeline.kernels.vnni_int4 import LINEAR_CPP, QUANTIZE_ROW_CPP

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

// vnni_int4.pack's layout: per task (GROUP channels), per pair of four-input quads, BLOCKS blocks of BLOCK
// channels x PAIR / 2 bytes; register h (of HALVES) holds channels 8h.. of the task.
constexpr int64_t BLOCK = 16, PAIR = 8, GROUP = 64, BLOCKS = GROUP / BLOCK, HALVES = GROUP / 8, ROWS = 8;

// 8 bfloat16 values as float32 (exact: a bfloat16 is a float32's upper half).
inline __m256 widened(const uint16_t* v) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
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

#define OP_FUNCTION avx2_int4_linear
#define OP "avx2_int4_linear"
''' + LINEAR_CPP
EXTENSION = CompiledExtension("rag_avx2_int4", _SOURCE, ["avx2_int4_linear"], avx2_int8.CFLAGS, frozenset({"avx2"}),
                              ldflags=("-fopenmp",))
