"""int8-dynamic's per-row glue in two C++ passes: quantize and rescale + bias.

:class:`~pipeline.kernels.int8.Int8DynamicLinear` runs, per call, about a dozen small torch ops
around the int8 product (abs, amax, clamp, divide, round, clamp, cat or cast; multiply, add), each
a dispatch and a pass over memory. These functions do the same arithmetic in one pass each (the
codes as floats after fbgemm's anchor row, or as int8 for oneDNN), and give the same bits for finite inputs (tests/unit/test_fused_int8.py; a NaN or infinite
activation gives NaN there and clamped codes here): the scale is max|x| clamped to
1e-12, divided by 127 in float32; codes are x / scale rounded half to even (true division, no
reciprocal); the output is sums x row scale, then + bias, two roundings (compiled with
-ffp-contract=off: no fused multiply-add).

The extension is compiled once per source version by ``python -m pipeline.kernels.compiled``
(pipeline.kernels.compiled; about 40 s with g++ on 2 cores). :data:`fused_ops` only loads what is
already built: where nothing is built (or no x86-64-v3 CPU) the torch ops run, with the same results.
"""
from __future__ import annotations

from pipeline.kernels.compiled import CompiledExtension

# int8-dynamic's per-row quantization in C++ (torch's row_codes' arithmetic): this extension's and
# pipeline.kernels.vnni_int8's, one text.
ROW_CODES_CPP = r'''
// One row's scale: max |x| clamped to 1e-12, / 127 (a maximum is exact in any order: lanes let g++ vectorize).
inline float row_scale(const float* row, int64_t k) {
  float lane[16] = {0.f};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    for (int l = 0; l < 16; ++l) { const float a = std::fabs(row[i + l]); lane[l] = a > lane[l] ? a : lane[l]; }
  float amax = 0.f;
  for (; i < k; ++i) { const float a = std::fabs(row[i]); amax = a > amax ? a : amax; }
  for (int l = 0; l < 16; ++l) amax = lane[l] > amax ? lane[l] : amax;
  return std::max(amax, 1e-12f) / 127.0f;
}

// A value's code: x / scale rounded half to even, clamped to +-127.
inline float row_code(float x, float scale) { return std::min(127.0f, std::max(-127.0f, std::nearbyint(x / scale))); }
'''

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
''' + ROW_CODES_CPP + r'''
// One row's scale and its codes.
template <typename T>
static float quantize_row(const float* row, int64_t k, T* out) {
  const float s = row_scale(row, k);
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<T>(row_code(row[j], s));
  return s;
}

// (n, k) float32 rows -> (first + n, k) codes of type T (after `first` rows the caller fills), (n, 1) scales.
template <typename T>
static std::vector<torch::Tensor> codes_after(const torch::Tensor& x, int64_t first, at::ScalarType type) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "row codes: 2-D float32 rows");
  const auto xc = x.contiguous();
  const int64_t n = xc.size(0), k = xc.size(1);
  auto codes = torch::empty({first + n, k}, xc.options().dtype(type));
  auto scales = torch::empty({n, 1}, xc.options());
  const float* src = xc.data_ptr<float>();
  T* dst = codes.data_ptr<T>() + first * k;
  float* sc = scales.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) sc[r] = quantize_row<T>(src + r * k, k, dst + r * k);
  });
  return {codes, scales};
}

// (n, k) float32 rows -> (n + 1, k) float codes after `anchor` (k floats), and (n, 1) row scales.
std::vector<torch::Tensor> anchored_row_codes(const torch::Tensor& x, const torch::Tensor& anchor) {
  TORCH_CHECK(anchor.scalar_type() == at::kFloat && anchor.numel() == x.size(-1),
              "anchored_row_codes: the anchor needs one float32 value per column");
  auto out = codes_after<float>(x, 1, at::kFloat);
  out[0][0].copy_(anchor.reshape({x.size(-1)}));
  return out;
}

// (first + n, m) sums -> (n, m) sums[first:] * scale[row], then + bias[col].
torch::Tensor rescale_rows(const torch::Tensor& sums, int64_t first, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(sums.dim() == 2 && sums.scalar_type() == at::kFloat, "rescale_rows: 2-D float32 sums");
  const auto sc = sums.contiguous();
  const auto scl = scales.contiguous();
  const int64_t n = sc.size(0) - first, m = sc.size(1);
  TORCH_CHECK(first >= 0 && n >= 0 && scl.numel() == n, "rescale_rows: one scale per row after the first");
  auto out = torch::empty({n, m}, sc.options());
  const float* src = sc.data_ptr<float>() + first * m;
  const float* s = scl.data_ptr<float>();
  c10::optional<torch::Tensor> bc;
  if (bias.has_value()) {
    bc = bias->contiguous();
    TORCH_CHECK(bc->scalar_type() == at::kFloat && bc->numel() == m, "rescale_rows: float32 bias of m values");
  }
  const float* b = bc.has_value() ? bc->data_ptr<float>() : nullptr;
  float* dst = out.data_ptr<float>();
  const int64_t chunk = 4096;  // columns per task: rows are few (decode), columns up to the vocabulary
  const int64_t chunks = (m + chunk - 1) / chunk;
  at::parallel_for(0, n * chunks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, c0 = (t % chunks) * chunk, c1 = std::min(m, c0 + chunk);
      const float rs = s[r];
      const float* in = src + r * m;
      float* o = dst + r * m;
      if (b) { for (int64_t j = c0; j < c1; ++j) { const float v = in[j] * rs; o[j] = v + b[j]; } }
      else { for (int64_t j = c0; j < c1; ++j) o[j] = in[j] * rs; }
    }
  });
  return out;
}
'''
_FUNCTIONS = ["anchored_row_codes", "rescale_rows"]
# x86-64-v3 (AVX2, SSE4.1 rounding) lets g++ vectorize both loops; no FMA contraction: the
# multiply and the add round separately, as torch's separate ops do. -fopenmp: at::parallel_for's
# OpenMP loop is compiled in (without it one thread: 2x slower at 8 x 151,936 or 3,000 x 768 values).
_CFLAGS = ["-O3", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]
EXTENSION = CompiledExtension("rag_int8_fused", _SOURCE, _FUNCTIONS, _CFLAGS, frozenset({"avx2", "sse4_1"}),
                              ldflags=("-fopenmp",))
# The built extension (anchored_row_codes, rescale_rows), or None where it is not built for this source
# version and torch, does not load, or this CPU lacks AVX2. Never compiles.
fused_ops = EXTENSION.ops
