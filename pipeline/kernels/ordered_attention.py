"""Attention on the CPU with each query's keys summed in order, first to last: a row's bits by construction.

Every (row, head, query) is computed on its own from its own query and its row's keys, in one order
fixed by those keys alone:

* a score is q . k_j over the head size in eight lanes (lane l sums dimensions l, l + 8, ... in order)
  added as ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), times the scaling;
* the row's largest visible score is subtracted (a maximum is exact in any order) and each visible
  key's weight is exp(score - largest) by one polynomial (Cephes' expf; 0 below e^-87), plain float
  operations;
* the weights and the weighted values are summed key after key, first to last, skipping a key of
  weight 0 (an unseen key is never added, not even as a zero), and the sum divided by the weights'.

Nothing in it depends on the other rows, the padding after or before a row's keys, how many queries
came in one call (a prompt whole or in pieces, or a decode step), the thread count, or the machine:
the source is compiled with -ffp-contract=off (no fused multiply-add) and without fast-math, so the
compiler vectorizes those loops without reordering a sum, and every x86-64 CPU with AVX2 (AVX2-only,
AVX-512, AMX alike) gives the same bits. A task (one row's kv head, up to eight queries) reads its keys
and its values once each, a block at a time made float beside the sums that use it, every query's sums
running over a block before the next (a decode step's seven query heads a kv head share one pass over
memory; docs/performance.md, sections 18 and 27). It reads up to the row's last visible key and no further:
a decode step's cost follows each row's own length, not the batch's widest. It is registered with torch's
dispatcher (``EXTENSION.registered("ordered_attention")``): profilers and op counts see it.

On a CPU where it is built (``python -m pipeline.kernels.compiled``) every decoder attention call runs it: each
decode step and each prompt's queries, whole or in the engine's pieces (pipeline.kernels.batch_invariance), faster
than SDPA in pieces of 512 (docs/performance.md, section 33). Elsewhere a decode step takes torch's flash kernel
in chunks and a prompt SDPA row by row (as encoders always do): the bits a CPU gives depend on whether it is
built, as on the device (the reference oracle runs in the same process, with the same kernel).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.kernels.compiled import CompiledExtension

if TYPE_CHECKING:  # imported by `python -m pipeline.kernels.compiled`, which finds a build without torch
    import torch

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <bit>
#include <cstdint>
#include <immintrin.h>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t QUERY_BLOCK = 8;  // queries per task (times the kv head's query heads)
constexpr float NO_KEY = -std::numeric_limits<float>::infinity();
constexpr int64_t AHEAD = 16;      // keys (or values) ahead of the block in use asked for from memory
constexpr int64_t VALUE_TILE = 64;  // values summed for every query row before the next ones are read

// exp(x) for x <= 0 (Cephes' expf): 2^n * p(r), r = x - n ln 2; 0 below -87 (under 1.7e-38 of the top).
inline float exp_nonpositive(float x) {
  const float big = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer, half to even
  const float t = x < -87.0f ? -87.0f : x;
  const float n = (t * 1.44269504088896341f + big) - big;
  float r = t - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r;
  p = p + 1.0f;
  const float e = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : e;
}

// `count` rows of `dim` (DIM where known) values, `stride` apart, as float rows: float ones in place, others
// converted into `buffer` (exactly: every bfloat16 and half is a float). Returns the first row and the rows' stride.
template <typename T, int64_t DIM>
inline std::pair<const float*, int64_t> as_float(const T* __restrict rows, int64_t stride, int64_t count,
                                                 int64_t runtime_dim, float* __restrict buffer) {
  if constexpr (std::is_same_v<T, float>) return {rows, stride};
  const int64_t dim = DIM ? DIM : runtime_dim;
  for (int64_t j = 0; j < count; ++j)
    for (int64_t d = 0; d < dim; ++d) buffer[j * dim + d] = static_cast<float>(rows[j * stride + d]);
  return {buffer, dim};
}

// Asks for rows [j0, j1) of `rows` (`bytes` each, `stride` elements apart) into the cache `HINT` names.
template <int HINT, typename T>
inline void prefetch_rows(const T* rows, int64_t stride, int64_t j0, int64_t j1, int64_t bytes) {
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t b = 0; b < bytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(rows + j * stride) + b, static_cast<_mm_hint>(HINT));
}

// a . b over `dim` values (DIM where it is known at compile time, for unrolled loops; the same order).
template <int64_t DIM>
inline float dot(const float* __restrict a, const float* __restrict b, int64_t runtime_dim) {
  const int64_t dim = DIM ? DIM : runtime_dim;
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + a[d + l] * b[d + l];
  for (int l = 0; d + l < dim; ++l) lane[l] = lane[l] + a[d + l] * b[d + l];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// Eight keys' lane vectors to their eight dot products, in key order, each key's lanes added as dot adds
// them: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
inline __m256 reduce_eight(const __m256 (&lane)[8]) {
  // per key: [0 + 4, 1 + 5, 2 + 6, 3 + 7], keys i and i + 4 side by side
  const auto halves = [&](int i) {  // key i's low lanes + its high ones, beside key i + 4's
    return _mm256_add_ps(_mm256_permute2f128_ps(lane[i], lane[i + 4], 0x20),
                         _mm256_permute2f128_ps(lane[i], lane[i + 4], 0x31));
  };
  const __m256 a04 = halves(0), a15 = halves(1), a26 = halves(2), a37 = halves(3);
  // per key: [(0 + 4) + (2 + 6), (1 + 5) + (3 + 7)]
  const __m256 b0145 = _mm256_add_ps(_mm256_shuffle_ps(a04, a15, 0x44), _mm256_shuffle_ps(a04, a15, 0xEE));
  const __m256 b2367 = _mm256_add_ps(_mm256_shuffle_ps(a26, a37, 0x44), _mm256_shuffle_ps(a26, a37, 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(b0145, b2367, 0x88), _mm256_shuffle_ps(b0145, b2367, 0xDD));
}

// Every query row's scores over keys [0, widest): out[row * widest + j] = (q_row . key j) x scaling, each dot in
// dot's order. Eight keys at a time, made float into `buffer` (8 x dim floats; float keys read in place), for
// all rows (a key block read from memory once, the next ones asked for ahead, the same keys' values asked into
// the L2 cache for weighted_sums); where the head size is a known multiple of 8, eight independent sums a row,
// reduced together.
template <typename T, int64_t DIM>
inline void scores(const float* __restrict q, int64_t n, const T* __restrict keys, int64_t stride,
                   const T* __restrict values, int64_t value_stride, int64_t widest, int64_t runtime_dim, float scaling,
                   float* __restrict out, float* __restrict buffer) {
  const int64_t dim = DIM ? DIM : runtime_dim, bytes = dim * static_cast<int64_t>(sizeof(T));
  const __m256 scale = _mm256_set1_ps(scaling);
  for (int64_t j = 0; j < widest; j += 8) {
    const int64_t count = std::min<int64_t>(8, widest - j);
    prefetch_rows<_MM_HINT_T0>(keys, stride, std::min(widest, j + AHEAD), std::min(widest, j + AHEAD + 8), bytes);
    prefetch_rows<_MM_HINT_T1>(values, value_stride, j, j + count, bytes);
    const auto [block, block_stride] = as_float<T, DIM>(keys + j * stride, stride, count, dim, buffer);
    if (DIM > 0 && DIM % 8 == 0 && count == 8) {  // (compiled out for other head sizes)
      for (int64_t row = 0; row < n; ++row) {
        const float* qr = q + row * DIM;
        __m256 lane[8];
        for (int i = 0; i < 8; ++i) lane[i] = _mm256_setzero_ps();
        for (int64_t d = 0; d + 8 <= DIM; d += 8) {
          const __m256 qd = _mm256_loadu_ps(qr + d);
          for (int i = 0; i < 8; ++i)
            lane[i] = _mm256_add_ps(lane[i], _mm256_mul_ps(qd, _mm256_loadu_ps(block + i * block_stride + d)));
        }
        _mm256_storeu_ps(out + row * widest + j, _mm256_mul_ps(reduce_eight(lane), scale));
      }
      continue;
    }
    for (int64_t i = 0; i < count; ++i)
      for (int64_t row = 0; row < n; ++row)
        out[row * widest + j + i] = dot<DIM>(q + row * dim, block + i * block_stride, dim) * scaling;
  }
}

// The largest of s[0, n), NO_KEY for none.
inline float largest(const float* __restrict s, int64_t n) {
  float lane[16], top = NO_KEY;
  std::fill(lane, lane + 16, NO_KEY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] = s[j + l] > lane[l] ? s[j + l] : lane[l];
  for (; j < n; ++j) top = s[j] > top ? s[j] : top;
  for (int l = 0; l < 16; ++l) top = lane[l] > top ? lane[l] : top;
  return top;
}

// For every query row: the sum over keys j < widest (first to last, a weight of 0 skipped: a row's weights past
// its last key are 0) of w[row * widest + j] x values[j] into sums[row] (dim values), and of its weights into
// totals[row]. VALUE_TILE keys at a time for all rows (a tile made float into `buffer`, VALUE_TILE x dim floats,
// float values read in place; the next tile asked for ahead); where the head size is known at compile time,
// each row's sums in registers over a tile.
template <typename T, int64_t DIM>
inline void weighted_sums(const float* __restrict w, int64_t n, int64_t widest, const T* __restrict values,
                          int64_t stride, int64_t runtime_dim, float* __restrict sums, float* __restrict totals,
                          float* __restrict buffer) {
  const int64_t dim = DIM ? DIM : runtime_dim;
  for (int64_t j0 = 0; j0 < widest; j0 += VALUE_TILE) {
    const int64_t j1 = std::min(widest, j0 + VALUE_TILE);
    prefetch_rows<_MM_HINT_T0>(values, stride, j1, std::min(widest, j1 + AHEAD), dim * static_cast<int64_t>(sizeof(T)));
    const auto [tile_values, tile_stride] = as_float<T, DIM>(values + j0 * stride, stride, j1 - j0, dim, buffer);
    for (int64_t row = 0; row < n; ++row) {
      const float* wr = w + row * widest;
      const auto tile = [&](float* __restrict acc, float total) {
        for (int64_t j = j0; j < j1; ++j)
          if (const float p = wr[j], *vr = tile_values + (j - j0) * tile_stride; p != 0.0f) {
            total = total + p;
            for (int64_t d = 0; d < dim; ++d) acc[d] = acc[d] + p * vr[d];
          }
        return total;
      };
      if constexpr (DIM > 0) {  // the row's sums in registers over the tile
        float acc[DIM];
        std::copy(sums + row * DIM, sums + (row + 1) * DIM, acc);
        totals[row] = tile(acc, totals[row]);
        std::copy(acc, acc + DIM, sums + row * DIM);
      } else totals[row] = tile(sums + row * dim, totals[row]);
    }
  }
}

template <typename T, int64_t DIM>
void attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
            const c10::optional<torch::Tensor>& mask, const c10::optional<torch::Tensor>& lengths,
            bool causal, float scaling, torch::Tensor& out) {
  const int64_t rows = query.size(0), heads = query.size(1), queries = query.size(2);
  const int64_t dim = DIM ? DIM : query.size(3);
  const int64_t kv_heads = key.size(1), keys = key.size(2), group = heads / kv_heads;
  const int64_t blocks = (queries + QUERY_BLOCK - 1) / QUERY_BLOCK;
  const T *q = query.data_ptr<T>(), *k = key.data_ptr<T>(), *v = value.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1), qs2 = query.stride(2);
  const int64_t ks0 = key.stride(0), ks1 = key.stride(1), ks2 = key.stride(2);
  const int64_t vs0 = value.stride(0), vs1 = value.stride(1), vs2 = value.stride(2);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);
  const bool* m = mask.has_value() ? mask->data_ptr<bool>() : nullptr;
  const int64_t ms0 = m ? mask->stride(0) : 0, ms2 = m ? mask->stride(2) : 0, ms3 = m ? mask->stride(3) : 0;
  const int64_t* len = lengths.has_value() ? lengths->data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, rows * kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, weights, buffer(VALUE_TILE * dim), sums, totals;
    std::vector<int64_t> ends;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / (kv_heads * blocks), h = (task / blocks) % kv_heads, b = task % blocks;
      const int64_t i0 = b * QUERY_BLOCK, i1 = std::min(queries, i0 + QUERY_BLOCK), span = i1 - i0;
      const int64_t n = span * group, limit = len ? std::clamp<int64_t>(len[r], 0, keys) : keys;
      // The task's query rows: row g * span + (i - i0) is query i of head h * group + g; `ends`: its keys' end.
      ends.assign(n, limit);
      qf.resize(n * dim);
      int64_t widest = 0;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t row = g * span + (i - i0);
          const T* src = q + r * qs0 + (h * group + g) * qs1 + i * qs2;
          for (int64_t d = 0; d < dim; ++d) qf[row * dim + d] = static_cast<float>(src[d]);
          if (causal) ends[row] = std::clamp<int64_t>(limit - queries + i + 1, 0, limit);
          widest = std::max(widest, ends[row]);
        }
      // Scores of every row over the widest row's keys (past a row's own end they are overwritten below).
      weights.resize(n * widest);
      scores<T, DIM>(qf.data(), n, k + r * ks0 + h * ks1, ks2, v + r * vs0 + h * vs1, vs2, widest, dim, scaling,
                     weights.data(), buffer.data());
      // Each row's weights in place of its scores: exp(score - the row's largest) where it sees the key, else 0.
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t row = g * span + (i - i0), stop = ends[row];
          float* s = weights.data() + row * widest;
          if (m) {
            const bool* sees = m + r * ms0 + i * ms2;
            for (int64_t j = 0; j < stop; ++j) s[j] = sees[j * ms3] ? s[j] : NO_KEY;
          }
          const float top = largest(s, stop);
          if (top == NO_KEY) std::fill(s, s + stop, 0.0f);
          else for (int64_t j = 0; j < stop; ++j) s[j] = exp_nonpositive(s[j] - top);
          std::fill(s + stop, s + widest, 0.0f);
        }
      // Each row's weighted values and weights, summed key after key; a key of weight 0 is skipped.
      sums.assign(n * dim, 0.0f);
      totals.assign(n, 0.0f);
      weighted_sums<T, DIM>(weights.data(), n, widest, v + r * vs0 + h * vs1, vs2, dim, sums.data(), totals.data(),
                            buffer.data());
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t row = g * span + (i - i0);
          const float total = totals[row];
          const float* a = sums.data() + row * dim;
          T* dst = o + r * os0 + (h * group + g) * os1 + i * os2;
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(total > 0.0f ? a[d] / total : 0.0f);
        }
    }
  });
}

template <typename T>
void attend_any_size(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                     const c10::optional<torch::Tensor>& mask, const c10::optional<torch::Tensor>& lengths,
                     bool causal, float scaling, torch::Tensor& out) {
  switch (query.size(3)) {  // the head sizes of the models served, unrolled; any other size, the same sums
    case 64: attend<T, 64>(query, key, value, mask, lengths, causal, scaling, out); break;
    case 32: attend<T, 32>(query, key, value, mask, lengths, causal, scaling, out); break;
    default: attend<T, 0>(query, key, value, mask, lengths, causal, scaling, out);
  }
}

}  // namespace

torch::Tensor ordered_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                const c10::optional<torch::Tensor>& mask, const c10::optional<torch::Tensor>& lengths,
                                bool causal, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "ordered_attention: 4-d query, key and value");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == query.size(0) && key.size(3) == query.size(3)
              && key.size(1) > 0 && query.size(1) % key.size(1) == 0, "ordered_attention: shapes do not match");
  TORCH_CHECK(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(),
              "ordered_attention: query, key and value in one dtype");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1,
              "ordered_attention: each head's values contiguous");
  if (mask.has_value())
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4 && mask->size(0) == query.size(0)
                && mask->size(2) == query.size(2) && mask->size(3) == key.size(2),
                "ordered_attention: a bool mask (rows, 1, queries, keys)");
  if (lengths.has_value())
    TORCH_CHECK(lengths->scalar_type() == at::kLong && lengths->dim() == 1 && lengths->size(0) == query.size(0)
                && lengths->is_contiguous(), "ordered_attention: int64 lengths, one per row");
  auto out = torch::empty(query.sizes(), query.options());
  const float s = static_cast<float>(scaling);
  switch (query.scalar_type()) {
    case at::kFloat: attend_any_size<float>(query, key, value, mask, lengths, causal, s, out); break;
    case at::kBFloat16: attend_any_size<c10::BFloat16>(query, key, value, mask, lengths, causal, s, out); break;
    case at::kHalf: attend_any_size<c10::Half>(query, key, value, mask, lengths, causal, s, out); break;
    default: TORCH_CHECK(false, "ordered_attention: float32, bfloat16 or float16");
  }
  return out;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) { m.def("ordered_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, "
                                             "Tensor? lengths, bool causal, float scaling) -> Tensor"); }

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) { m.impl("ordered_attention", &ordered_attention); }
'''
# -ffp-contract=off: no fused multiply-add (a product and a sum round apart, on every CPU);
# -fno-trapping-math: lets g++ vectorize the selects (a mask, exp's underflow) without changing a result;
# -fopenmp: at::parallel_for's OpenMP loop is compiled into the extension (without it, one thread).
_CFLAGS = ["-O3", "-std=c++20", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fopenmp"]
EXTENSION = CompiledExtension("rag_ordered_attention", _SOURCE, ["ordered_attention"], _CFLAGS,
                              frozenset({"avx2"}), ldflags=("-fopenmp",))


def ordered_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                      *, scaling: float, is_causal: bool = False, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of `query` (rows, heads, queries, head size) over `key`/`value` (rows, kv heads, keys, head size),
    kv head j serving query heads j * g .. j * g + g - 1 (g = heads / kv heads); any strides but the head size's.

    Which keys a query sees: those a bool `mask` (broadcastable to (rows, 1, queries, keys)) marks, below the
    row's `lengths` (int64 (rows,); all keys where None), and with `is_causal` up to the query's own key
    (query i is key length - queries + i): all three where given. A query that sees no key gets zeros.
    Returns (rows, heads, queries, head size) in the query's dtype. Needs the built extension
    (:data:`EXTENSION`)."""
    op = EXTENSION.registered("ordered_attention")
    if op is None:
        raise RuntimeError(f"{EXTENSION.name} is not built: python -m pipeline.kernels.compiled")
    if mask is not None:
        mask = mask.expand(query.shape[0], 1, query.shape[2], key.shape[2])
    return op(query, key, value, mask, lengths, is_causal, scaling)
