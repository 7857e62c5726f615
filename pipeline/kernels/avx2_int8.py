"""int8-dynamic's whole product in one C++ call on a CPU with AVX2 and no VNNI: exact, where fbgemm is not.

Without VNNI, x86's int8 product is ``vpmaddubsw`` (unsigned bytes x signed bytes, adjacent pairs summed to a
*saturating* 16-bit sum) then ``vpmaddwd`` to 32 bits. fbgemm and oneDNN feed it activations + 128 (0..255)
against weights of -127..127: a pair can reach 2 x 255 x 127 = 64,770 and saturate at 32,767, so on such a CPU
their int8 sums are wrong, and int8-dynamic was not offered there (pipeline/precision_policy.py). Here each
product is taken as ``|w| x (code x sign(w))`` (``vpsignb`` twice): |w| <= 128 unsigned, the signed code
|code x sign(w)| <= 127, so a pair is at most 2 x 128 x 127 = 32,512 and never saturates; ``vpmaddwd`` by ones
then adds the pairs to 32 bits. The integer sum of code x weight is exact, in any order, so the result is
pipeline.kernels.vnni_int8's for every row at any row count, bit for bit (tests/unit/test_packed_int8.py):

* each row quantized as pipeline.kernels.fused_int8 does (scale max|x| clamped to 1e-12, / 127; codes
  x / scale rounded half to even), kept as signed bytes;
* int32 sums over the weight as :func:`pipeline.kernels.vnni_int8.pack` lays it out (a group of 64 output
  channels one run of memory, quad by quad; eight channels a 256-bit register);
* the output float(sum) x channel scale x row scale (+ bias), each product rounded on its own, as vnni_int8's.

It takes vnni_int8's arguments and runs vnni_int8's op around its own sums (``vnni_int8.LINEAR_CPP``); the
channels' offsets (what vnni_int8's codes + 128 add to its sums) are checked and not used: its codes are signed.

Four instructions a register of products where VNNI takes one: at a decode step's rows the read still
dominates at one row, the arithmetic past it. Built with ``-mavx2`` alone, it runs on every CPU kind seen
(AVX2-only, AVX-512, AMX); :class:`pipeline.kernels.int8.Int8DynamicLinear` takes it where vnni_int8 is not
usable. It is registered with torch's dispatcher (``EXTENSION.registered("avx2_linear")``): profilers see it.
"""
from __future__ import annotations

from pipeline.kernels.compiled import CompiledExtension
from pipeline.kernels.fused_int8 import ROW_CODES_CPP
from pipeline.kernels.vnni_int8 import LINEAR_CPP

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

// vnni_int8.pack's layout: per group of GROUP channels, per quad of inputs, GROUP x QUAD bytes (channel-major
// within a quad: eight channels' four bytes fill one 256-bit register, HALVES registers a quad).
constexpr int64_t BLOCK = 16, QUAD = 4, GROUP = 64, HALVES = GROUP / 8, ROWS = 8;

using Code = int8_t;  // signed: |w| x (code x sign(w)) never saturates a 16-bit pair sum

// The kernel's sums are code x weight already: the channel's offset (what vnni_int8's codes + 128 add) is not used.
inline int32_t exact_sum(int32_t sum, int32_t) { return sum; }

// One row's scale and its codes (signed), zeros in the padding (code 0 against a zero weight).
float quantize_row(const float* row, int64_t k, int64_t padded, int8_t* out) {
  const float s = row_scale(row, k);
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int8_t>(row_code(row[j], s));
  std::fill(out + k, out + padded, int8_t(0));
  return s;
}

// Sums of R rows of codes (stride `stride`) against H registers of a group's channels from register `first`:
// R x H sums (at most 8, with the weights, |weights| and the row's bytes: 16 registers).
template <int R, int H>
inline void sums(const int8_t* codes, int64_t stride, const int8_t* w, int64_t quads, int first, int32_t* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][H];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_si256();
  for (int64_t q = 0; q < quads; ++q) {
    const int8_t* quad = w + q * GROUP * QUAD + first * 32;
    __m256i wv[H], magnitude[H];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      wv[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad + h * 32));
      magnitude[h] = _mm256_sign_epi8(wv[h], wv[h]);  // |w|; -128 stays 0x80, 128 unsigned
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, codes + r * stride + q * QUAD, sizeof four);
      const __m256i a = _mm256_set1_epi32(four);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(a, wv[h]));  // |pair| <= 32,512
        acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * GROUP + (first + h) * 8), acc[r][h]);
}

// One group's sums for R (<= 4) rows: as many registers a pass as the sums fit, passes over the group's
// weights (the later ones from the cache) until every register of it is summed.
template <int R>
inline void group_sums(const int8_t* codes, int64_t stride, const int8_t* w, int64_t quads, int32_t* out) {
  constexpr int H = R == 1 ? 8 : R == 2 ? 4 : 2;
  for (int first = 0; first < HALVES; first += H) sums<R, H>(codes, stride, w, quads, first, out);
}

void any_rows(int64_t rows, const int8_t* codes, int64_t stride, const int8_t* w, int64_t quads, int32_t* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const int8_t* c = codes + r0 * stride;
    int32_t* o = out + r0 * GROUP;
    switch (std::min<int64_t>(4, rows - r0)) {
      case 1: group_sums<1>(c, stride, w, quads, o); break;
      case 2: group_sums<2>(c, stride, w, quads, o); break;
      case 3: group_sums<3>(c, stride, w, quads, o); break;
      default: group_sums<4>(c, stride, w, quads, o);
    }
  }
}

}  // namespace

#define OP_FUNCTION avx2_linear
#define OP "avx2_linear"
''' + LINEAR_CPP
# -ffp-contract=off: the float products and sums round one at a time, as vnni_int8's and torch's separate ops do.
CFLAGS = ["-O3", "-std=c++17", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]
EXTENSION = CompiledExtension("rag_avx2_int8", _SOURCE, ["avx2_linear"], CFLAGS, frozenset({"avx2"}),
                              ldflags=("-fopenmp",))
