"""A decode step's per-layer glue in single C++ calls, each giving the bits of the torch ops it replaces.

The CPU decode step (pipeline/continuous/qwen2_step.py) runs, around each layer's products, a dozen
small torch ops per norm and per rotary embedding: each a dispatch, an allocation and a pass over a
few kilobytes. At one row those are most of a step's time outside the products. These calls do the same
arithmetic, element by element in the same order, each result rounded to the tensor's dtype where a
torch op would round it (compiled with -ffp-contract=off: no fused multiply-add), so the step keeps
the model's forward's bits (tests/unit/test_decode_glue.py, tests/unit/test_qwen2_step.py):

* ``rotate_and_store``: q's and k's heads rotated as ``(x * cos) + (roll(x, half) * sin)`` with the
  sign folded into sin (``rotate_half(x) * sin``'s bits: (-a) * s and a * (-s) round alike), the new
  keys and values written into the slot table's flat buffers at their rows, and q returned in the
  layout the attention reads;
* ``rms_norm``: RMSNorm, its mean of squares by torch's own ``pow`` and ``mean`` called from C++ (the same
  kernels: the sum keeps torch's order), then ``(x * rsqrt(variance + eps))`` rounded to x's dtype, times
  the weight;
* ``add_rms_norm``: the residual add before a norm (torch's ``add_``, in place on the stream) and the norm;
* ``silu_mul``: silu of the fused gate and up product's gate half times its up half (torch's ``silu`` and ``mul_``
  called from C++: one call for three).

Built by ``python -m pipeline.kernels.compiled``; where it is not (no g++, no AVX2), the step runs the
torch ops, with the same results.
"""
from __future__ import annotations

from pipeline.kernels.compiled import CompiledExtension

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

// x rounded to bfloat16 as c10::BFloat16 rounds it (to nearest, ties to even; NaN to 0x7FC0), as float bits: the
// same arithmetic in plain integer operations without a branch, so g++ vectorizes the loops that call it.
inline uint32_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t r = (u + (((u >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
  return x != x ? 0x7FC00000u : r;
}

// The value torch stores for a float result in a tensor of type T (round to nearest even; float: as is).
template <typename T>
inline float rounded(float x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint32_t r = bf16_bits(x);
    float f;
    std::memcpy(&f, &r, sizeof f);
    return f;
  } else {
    return static_cast<float>(static_cast<T>(x));
  }
}

// x stored in a tensor of type T: rounded<T>(x)'s bits.
template <typename T>
inline T stored(float x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return c10::BFloat16(static_cast<uint16_t>(bf16_bits(x) >> 16), c10::BFloat16::from_bits());
  else return static_cast<T>(x);
}

template <typename T>
void rotate_rows(const torch::Tensor& qk, const torch::Tensor& v, const torch::Tensor& cos,
                 const torch::Tensor& sin, const torch::Tensor& keys, const torch::Tensor& values,
                 const torch::Tensor& written, int64_t heads, torch::Tensor& q) {
  const int64_t rows = qk.size(0), all_heads = qk.size(1), dim = qk.size(2), half = dim / 2;
  const int64_t kv_heads = all_heads - heads;
  const T* src = qk.data_ptr<T>();
  const T* vs = v.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  T* kd = keys.data_ptr<T>();
  T* vd = values.data_ptr<T>();
  T* qd = q.data_ptr<T>();
  const int64_t* at_row = written.data_ptr<int64_t>();
  const int64_t qs0 = qk.stride(0), qs1 = qk.stride(1), vs0 = v.stride(0);
  at::parallel_for(0, rows * all_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / all_heads, h = task % all_heads;
      const T* x = src + r * qs0 + h * qs1;
      const T* cr = c + r * dim;
      const T* sr = s + r * dim;
      T* out = h < heads ? qd + (r * heads + h) * dim : kd + at_row[r * kv_heads + (h - heads)] * dim;
      // x[d] x cos + x[(d + half) % dim] x sin, in two halves (no modulo: each half one vector loop)
      const auto rotate = [&](int64_t d0, int64_t d1, int64_t other) {
        for (int64_t d = d0; d < d1; ++d) {
          const float a = rounded<T>(static_cast<float>(x[d]) * static_cast<float>(cr[d]));
          const float b = rounded<T>(static_cast<float>(x[d + other]) * static_cast<float>(sr[d]));
          out[d] = stored<T>(a + b);
        }
      };
      rotate(0, half, half);
      rotate(half, dim, -half);
      if (h >= heads) {  // this kv head's value, as written: a copy
        const T* vr = vs + r * vs0 + (h - heads) * dim;
        T* vo = vd + at_row[r * kv_heads + (h - heads)] * dim;
        for (int64_t d = 0; d < dim; ++d) vo[d] = vr[d];
      }
    }
  });
}

template <typename T>
void scale_rows(const torch::Tensor& x, const torch::Tensor& variance, const torch::Tensor& weight, float eps,
                torch::Tensor& out) {
  const int64_t rows = x.size(0), width = x.size(1), xs0 = x.stride(0);
  const T* xd = x.data_ptr<T>();
  const float* var = variance.data_ptr<float>();
  const T* w = weight.data_ptr<T>();
  T* o = out.data_ptr<T>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float inv = 1.0f / std::sqrt(var[r] + eps);  // torch's add_ then rsqrt_: two roundings
      const T* xr = xd + r * xs0;
      T* orow = o + r * width;
      for (int64_t j = 0; j < width; ++j)
        orow[j] = stored<T>(rounded<T>(static_cast<float>(xr[j]) * inv) * static_cast<float>(w[j]));
    }
  });
}

}  // namespace

// qk (rows, heads + kv heads, head size), v (rows, kv heads x head size), cos and sin (rows, 1, head size)
// contiguous, keys/values (slots x ..., head size) flat buffers, written (rows x kv heads) their rows.
// Returns q rotated, (rows, heads, 1, head size).
torch::Tensor rotate_and_store(const torch::Tensor& qk, const torch::Tensor& v, const torch::Tensor& cos,
                               const torch::Tensor& sin, const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& written, int64_t heads) {
  TORCH_CHECK(qk.dim() == 3 && qk.stride(2) == 1 && qk.size(2) % 2 == 0 && heads > 0 && heads < qk.size(1),
              "rotate_and_store: qk (rows, heads + kv heads, even head size), each head contiguous");
  const int64_t rows = qk.size(0), kv_heads = qk.size(1) - heads, dim = qk.size(2);
  TORCH_CHECK(qk.stride(1) == dim, "rotate_and_store: qk's heads side by side");
  TORCH_CHECK(v.dim() == 2 && v.size(0) == rows && v.size(1) == kv_heads * dim && v.stride(1) == 1,
              "rotate_and_store: v (rows, kv heads x head size), each row contiguous");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == rows * dim && sin.numel() == rows * dim,
              "rotate_and_store: contiguous cos and sin of (rows, 1, head size)");
  TORCH_CHECK(keys.dim() == 2 && values.dim() == 2 && keys.is_contiguous() && values.is_contiguous()
              && keys.size(1) == dim && values.size(1) == dim && keys.size(0) == values.size(0),
              "rotate_and_store: contiguous flat key and value buffers of (n, head size)");
  TORCH_CHECK(written.scalar_type() == at::kLong && written.is_contiguous() && written.numel() == rows * kv_heads,
              "rotate_and_store: int64 rows to write, one per (row, kv head)");
  const auto type = qk.scalar_type();
  TORCH_CHECK(v.scalar_type() == type && cos.scalar_type() == type && sin.scalar_type() == type
              && keys.scalar_type() == type && values.scalar_type() == type, "rotate_and_store: one dtype");
  const int64_t* at_row = written.data_ptr<int64_t>();
  for (int64_t i = 0; i < written.numel(); ++i)
    TORCH_CHECK(at_row[i] >= 0 && at_row[i] < keys.size(0), "rotate_and_store: row ", at_row[i], " outside the buffers");
  auto q = torch::empty({rows, heads, 1, dim}, qk.options());
  switch (type) {
    case at::kFloat: rotate_rows<float>(qk, v, cos, sin, keys, values, written, heads, q); break;
    case at::kBFloat16: rotate_rows<c10::BFloat16>(qk, v, cos, sin, keys, values, written, heads, q); break;
    case at::kHalf: rotate_rows<c10::Half>(qk, v, cos, sin, keys, values, written, heads, q); break;
    default: TORCH_CHECK(false, "rotate_and_store: float32, bfloat16 or float16");
  }
  return q;
}

// x (rows, width) with contiguous rows, weight (width,): RMSNorm's ops after the cast to float32 (a no-op for
// float32 x), its mean of squares by torch's own pow and mean (their sums in torch's order).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rms_norm: x (rows, width), each row contiguous");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == x.size(1),
              "rms_norm: a weight of x's dtype, one value per column");
  const auto h = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const auto variance = h.pow(2).mean(-1, true);
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  const float e = static_cast<float>(eps);
  switch (x.scalar_type()) {
    case at::kFloat: scale_rows<float>(x, variance, weight, e, out); break;
    case at::kBFloat16: scale_rows<c10::BFloat16>(x, variance, weight, e, out); break;
    case at::kHalf: scale_rows<c10::Half>(x, variance, weight, e, out); break;
    default: TORCH_CHECK(false, "rms_norm: float32, bfloat16 or float16");
  }
  return out;
}

// hidden += delta in place (torch's add_), then rms_norm(hidden): a layer's residual add and the norm after it.
torch::Tensor add_rms_norm(torch::Tensor hidden, const torch::Tensor& delta, const torch::Tensor& weight, double eps) {
  hidden.add_(delta);
  return rms_norm(hidden, weight, eps);
}

// silu(gate) * up for gate_up = [gate | up] (rows, 2 x width), the fused gate and up product's output: torch's
// silu, then its mul_ in place on silu's fresh result.
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "silu_mul: gate_up (rows, 2 x width)");
  const int64_t width = gate_up.size(1) / 2;
  auto out = at::silu(gate_up.narrow(1, 0, width));
  return out.mul_(gate_up.narrow(1, width, width));
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def("rotate_and_store(Tensor qk, Tensor v, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor written, int heads) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) hidden, Tensor delta, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CPU, m) {
  m.impl("rotate_and_store", &rotate_and_store);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
}
'''
# -ffp-contract=off: each product and sum rounds on its own, as torch's separate ops round them.
_CFLAGS = ["-O3", "-std=c++17", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]
EXTENSION = CompiledExtension("rag_decode_glue", _SOURCE, ["rotate_and_store", "rms_norm", "add_rms_norm", "silu_mul"], _CFLAGS,
                              frozenset({"avx2"}), ldflags=("-fopenmp",))
