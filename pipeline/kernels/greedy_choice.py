"""A greedy row's next token in one C++ pass over its logits: the repetition penalty and the first argmax.

The torch ops it replaces (pipeline/continuous/sampling.py's TokenChooser on a greedy row) copy every row's
logits to float32 (rows x vocabulary: 4.9 MB a step at eight rows of Qwen2's 151,936), gather, penalize and
scatter the tokens the row has seen (transformers' RepetitionPenaltyLogitsProcessor), then search the copy for
its largest. Here each row is read once, a block of 1,024 logits at a time: a block holding none of the row's
seen tokens is searched as it lies (bfloat16 or float32), one holding some is made float in a 4 KB buffer and
its seen tokens penalized there, each once from its own logit: ``score < 0 ? score * p : score / p`` in float32
with p rounded to float32, as torch's ``where`` over its ``mul`` and ``div`` by a Python float computes it. The
index is torch's argmax's: the first of the largest, and the first NaN where a row has one (a NaN is larger
than any number). Compiled with -ffp-contract=off and without fast-math: the penalty's bits are IEEE float's;
a maximum is exact in any order. Each row is its own (tests/unit/test_greedy_choice.py: the torch ops' tokens).

Built by ``python -m pipeline.kernels.compiled``; where it is not (no g++, no AVX2), the chooser runs torch's ops.
"""
from __future__ import annotations

from pipeline.kernels.compiled import CompiledExtension

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t BLOCK = 1024;
constexpr float LOWEST = -std::numeric_limits<float>::infinity();

inline float as_float(float x) { return x; }
inline float as_float(c10::BFloat16 x) { return static_cast<float>(x); }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // a bfloat16 is a float's upper half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The largest number of v[0, n) (-inf where there is none) and whether any of them is NaN.
template <typename T>
inline float block_largest(const T* v, int64_t n, bool& nan) {
  __m256 largest = _mm256_set1_ps(LOWEST), unordered = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = load8(v + i);
    largest = _mm256_max_ps(x, largest);  // a NaN x gives the second operand: NaNs are counted apart
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = std::max(best, lanes[l]);
  nan = _mm256_movemask_ps(unordered) != 0;
  for (; i < n; ++i) {
    const float x = as_float(v[i]);
    if (x != x) nan = true;
    else best = std::max(best, x);
  }
  return best;
}

// The first index in v[0, n) holding `value`, or the first NaN where `nan`.
template <typename T>
inline int64_t first_at(const T* v, int64_t n, float value, bool nan) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = as_float(v[i]);
    if (nan ? x != x : x == value) return i;
  }
  return 0;  // not reached: the value is one of v's
}

template <typename T>
int64_t row_token(const T* logits, int64_t vocab, const int64_t* seen, int64_t width, float penalty,
                  std::vector<int64_t>& ids) {
  ids.assign(seen, seen + width);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  alignas(32) float buffer[BLOCK];
  size_t next = 0;  // the first seen id not yet penalized
  float best = LOWEST;
  int64_t chosen = 0;  // argmax of a row of -inf (or of nothing larger) is its first index
  for (int64_t start = 0; start < vocab; start += BLOCK) {
    const int64_t n = std::min(BLOCK, vocab - start);
    float largest;
    bool nan;
    const bool penalized = next < ids.size() && ids[next] < start + n;
    if (penalized) {
      for (int64_t i = 0; i < n; ++i) buffer[i] = as_float(logits[start + i]);
      for (; next < ids.size() && ids[next] < start + n; ++next) {
        float& score = buffer[ids[next] - start];
        score = score < 0 ? score * penalty : score / penalty;
      }
      largest = block_largest(buffer, n, nan);
    } else {
      largest = block_largest(logits + start, n, nan);
    }
    if (nan || largest > best) {
      chosen = start + (penalized ? first_at(buffer, n, largest, nan) : first_at(logits + start, n, largest, nan));
      best = largest;
      if (nan) break;  // the first NaN is argmax's answer
    }
  }
  return chosen;
}

template <typename T>
void choose_rows(const torch::Tensor& logits, const torch::Tensor& seen, float penalty, bool penalize,
                 int64_t* out) {
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  const int64_t width = penalize ? seen.size(1) : 0, seen_stride = seen.stride(0);
  const T* base = logits.data_ptr<T>();
  const int64_t* seen_base = seen.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> ids;
    for (int64_t r = begin; r < end; ++r)
      out[r] = row_token(base + r * stride, vocab, seen_base + r * seen_stride, width, penalty, ids);
  });
}

}  // namespace

// logits (rows, vocab), each row contiguous, float32 or bfloat16; seen (rows, width) int64 token ids, each row
// contiguous, repeats allowed: each row's greedy token after the repetition penalty (none where penalty is 1).
torch::Tensor greedy_tokens(const torch::Tensor& logits, const torch::Tensor& seen, double penalty) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "greedy_tokens: logits (rows, vocab), each row contiguous");
  TORCH_CHECK(seen.dim() == 2 && seen.scalar_type() == at::kLong && seen.size(0) == logits.size(0)
              && (seen.size(1) == 0 || seen.stride(1) == 1), "greedy_tokens: seen (rows, width) int64, rows contiguous");
  const int64_t* ids = seen.data_ptr<int64_t>();
  const bool penalize = penalty != 1.0;
  if (penalize)
    for (int64_t r = 0; r < seen.size(0); ++r)
      for (int64_t c = 0; c < seen.size(1); ++c) {
        const int64_t id = ids[r * seen.stride(0) + c];
        TORCH_CHECK(id >= 0 && id < logits.size(1), "greedy_tokens: seen token ", id, " outside the vocabulary");
      }
  auto out = torch::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  const float p = static_cast<float>(penalty);
  switch (logits.scalar_type()) {
    case at::kFloat: choose_rows<float>(logits, seen, p, penalize, out.data_ptr<int64_t>()); break;
    case at::kBFloat16: choose_rows<c10::BFloat16>(logits, seen, p, penalize, out.data_ptr<int64_t>()); break;
    default: TORCH_CHECK(false, "greedy_tokens: float32 or bfloat16 logits");
  }
  return out;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def("greedy_tokens(Tensor logits, Tensor seen, float penalty) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) {
  m.impl("greedy_tokens", &greedy_tokens);
}
'''
# -ffp-contract=off: the penalty's product and quotient each round as torch's ops round them.
_CFLAGS = ["-O3", "-std=c++17", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]
EXTENSION = CompiledExtension("rag_greedy_choice", _SOURCE, ["greedy_tokens"], _CFLAGS, frozenset({"avx2"}),
                              ldflags=("-fopenmp",))
