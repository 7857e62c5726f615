"""A CPU decode step's decoder layers in one C++ call: the same ops in the same order, without Python between them.

The CPU decode step (pipeline/continuous/qwen2_step.py) calls, per layer, about ten registered ops (the norms,
the products, the rotary and cache writes, the attention, silu x up), each from Python: a custom op called
through ``torch.ops`` costs about 4 µs of argument boxing before its kernel runs, a few hundred times a step.
:func:`decode_layers` calls the very same ops through torch's dispatcher from C++ (boxed, by each op's
schema: no C++ signature shared between extensions), layer after layer, and returns the last layer's down product (the residual's next delta):
each op receives the tensors it received from Python, so the step's bits are unchanged
(tests/unit/test_qwen2_step.py: both loops give the model forward's bits).

The profiler sees each op inside it as if called one by one (a dispatcher call records itself); a dispatch
mode, in inference mode, sees only the one call, so the step loops in Python while a mode is on.

A layer's parts travel as one flat list (:data:`PER_LAYER` entries a layer, built once per slot layout by the
step): its two norms' weights, its keys' and values' flat buffers and slot views, then four products (q/k/v
fused, o, gate/up fused, down), each a kind (:data:`ONEDNN`, :data:`VNNI_INT8`, :data:`VNNI_INT4`,
:data:`AVX2_INT8`, :data:`AVX2_INT4`, :data:`AVX512_BF16`) and up to
:data:`PRODUCT_PARTS` tensors (:func:`product`).
"""
from __future__ import annotations

from typing import Any

from pipeline.kernels.compiled import CompiledExtension

# a product's kind, as the C++ source numbers them
ONEDNN, VNNI_INT8, VNNI_INT4, AVX2_INT8, AVX2_INT4, AVX512_BF16 = 0, 1, 2, 3, 4, 5
PRODUCT_PARTS = 4
LAYER_HEAD = 6  # input norm, post-attention norm, keys' flat buffer, key slots, values' flat buffer, value slots
PER_LAYER = LAYER_HEAD + 4 * PRODUCT_PARTS

_SOURCE = r'''
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace {

using at::Tensor;
using Opt = std::optional<Tensor>;
using Parts = c10::List<Opt>;

constexpr int64_t ONEDNN = 0, VNNI_INT8 = 1, VNNI_INT4 = 2, AVX2_INT8 = 3, AVX2_INT4 = 4, AVX512_BF16 = 5, KINDS = 6;
constexpr int64_t PRODUCT_PARTS = 4, LAYER_HEAD = 6;
// Each kind's op in its extension's namespace (ONEDNN's is torch's own, mkldnn::_linear_pointwise).
constexpr const char* EXTENSION_OPS[KINDS] = {nullptr, "::vnni_linear", "::vnni_int4_linear", "::avx2_linear",
                                              "::avx2_int4_linear", "::bf16_linear"};
constexpr int64_t PER_LAYER = LAYER_HEAD + 4 * PRODUCT_PARTS;

// The ops a step calls, found by qualified name (the extensions' namespaces carry their source's version) and
// called boxed: through their schemas, whatever their kernels' C++ signatures.
struct Ops {
  c10::OperatorHandle rms_norm, add_rms_norm, rotate_and_store, silu_mul, attention;
  std::optional<c10::OperatorHandle> products[KINDS];  // each product kind's op, where registered (named)
};

// names: "glue namespace;attention namespace;" then each extension kind's namespace in kind order, VNNI_INT8 to
// AVX512_BF16 (empty where not built).
const Ops& ops_named(const std::string& names) {
  static std::mutex lock;
  static std::unordered_map<std::string, Ops> found;
  std::lock_guard<std::mutex> held(lock);
  auto hit = found.find(names);
  if (hit != found.end()) return hit->second;
  std::vector<std::string> ns;
  size_t start = 0;
  for (size_t end; (end = names.find(';', start)) != std::string::npos; start = end + 1)
    ns.push_back(names.substr(start, end - start));
  ns.push_back(names.substr(start));
  TORCH_CHECK(ns.size() == 1 + KINDS,
              "decode_layers: seven namespaces, glue;attention;int8;int4;avx2 int8;avx2 int4;avx512 bf16");
  const auto op = [](const std::string& name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), ""); };
  Ops o{op(ns[0] + "::rms_norm"), op(ns[0] + "::add_rms_norm"), op(ns[0] + "::rotate_and_store"),
        op(ns[0] + "::silu_mul"), op(ns[1] + "::ordered_attention"), {}};
  o.products[ONEDNN] = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  for (int64_t kind = VNNI_INT8; kind < KINDS; ++kind)
    if (!ns[1 + kind].empty()) o.products[kind] = op(ns[1 + kind] + EXTENSION_OPS[kind]);
  return found.emplace(names, std::move(o)).first->second;
}

Tensor call(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// One product over rows x, its parts at parts[at ..]: the call the step's Python makes for this kind.
Tensor product(const Ops& o, int64_t kind, int64_t channels, const Parts& parts, int64_t at, const Tensor& x) {
  const auto part = [&](int64_t i) -> c10::IValue { return parts.get(at + i); };
  TORCH_CHECK(kind >= 0 && kind < KINDS, "decode_layers: product kind ", kind);
  const auto& op = o.products[kind];
  if (kind == ONEDNN) {
    TORCH_CHECK(op.has_value(), "decode_layers: a oneDNN product in a torch without oneDNN");
    TORCH_CHECK(x.size(0) >= 2, "decode_layers: oneDNN's row-invariant product needs two rows or more");
    c10::List<std::optional<c10::Scalar>> scalars;
    scalars.push_back(std::nullopt);
    return call(*op, {x, part(0), part(1), "none", scalars, ""});
  }
  TORCH_CHECK(op.has_value(), "decode_layers: a product of kind ", kind, " (", EXTENSION_OPS[kind] + 2,
              ") without its extension");
  // vnni_int8 and avx2_int8 take (x, packed, offsets, scale, bias); vnni_int4 and avx2_int4 (x, packed, params,
  // channels, bias); bf16_linear (x, packed, channels, bias)
  if (kind == VNNI_INT8 || kind == AVX2_INT8) return call(*op, {x, part(0), part(1), part(2), part(3)});
  if (kind == AVX512_BF16) return call(*op, {x, part(0), channels, part(1)});
  return call(*op, {x, part(0), part(1), channels, part(2)});
}

}  // namespace

// Every layer of the step after the embedding: the residual stream `hidden` (rows, width) updated in place,
// the last layer's down product returned (the final norm adds it). `attending` rows attend (1 for a lone
// row run as a pair: its second row is the first's copy); kinds and channels: four a layer; eps: two.
Tensor decode_layers(Tensor hidden, const Parts& parts, at::IntArrayRef kinds,
                     at::IntArrayRef channels, at::ArrayRef<double> eps, c10::string_view names, const Tensor& cos,
                     const Tensor& sin, const Tensor& written, const Tensor& lengths, int64_t attending,
                     int64_t heads, int64_t kv_heads, double scaling) {
  const int64_t layers = static_cast<int64_t>(parts.size()) / PER_LAYER;
  TORCH_CHECK(static_cast<int64_t>(parts.size()) == layers * PER_LAYER && kinds.size() == 4 * layers
              && channels.size() == 4 * layers && eps.size() == 2 * layers, "decode_layers: parts of whole layers");
  const Ops& o = ops_named(std::string(names));
  const int64_t rows = hidden.size(0);
  Opt delta;  // what the residual stream adds before the next norm (none before the first layer's)
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t at = l * PER_LAYER;
    const auto part = [&](int64_t i) {
      const Opt found = parts.get(at + i);
      TORCH_CHECK(found.has_value(), "decode_layers: layer ", l, " lacks part ", i);
      return *found;
    };
    const auto multiply = [&](int64_t which, const Tensor& x) {
      return product(o, kinds[4 * l + which], channels[4 * l + which], parts, at + LAYER_HEAD + which * PRODUCT_PARTS, x);
    };
    const Tensor keys = part(2), values = part(4);
    const int64_t dim = keys.size(1), qk_width = (heads + kv_heads) * dim;
    Tensor x = delta.has_value() ? call(o.add_rms_norm, {hidden, *delta, part(0), eps[2 * l]})
                                 : call(o.rms_norm, {hidden, part(0), eps[2 * l]});
    const Tensor qkv = multiply(0, x);
    Tensor qk = qkv.narrow(1, 0, qk_width), v = qkv.narrow(1, qk_width, qkv.size(1) - qk_width);
    if (attending < rows) qk = qk.narrow(0, 0, attending), v = v.narrow(0, 0, attending);
    const Tensor q = call(o.rotate_and_store, {qk.view({attending, heads + kv_heads, dim}), v, cos, sin, keys,
                                               values, written, heads});
    Tensor out = call(o.attention, {q, part(3), part(5), c10::IValue(), lengths, true, scaling})
                     .view({attending, heads * dim});
    if (attending < rows) out = out.expand({rows, -1});
    x = call(o.add_rms_norm, {hidden, multiply(1, out), part(1), eps[2 * l + 1]});
    x = call(o.silu_mul, {multiply(2, x)});
    delta = multiply(3, x);
  }
  TORCH_CHECK(delta.has_value(), "decode_layers: no layers");
  return *delta;
}

TORCH_LIBRARY(EXTENSION_NAMESPACE, m) {
  m.def("decode_layers(Tensor(a!) hidden, Tensor?[] parts, int[] kinds, int[] channels, "
        "float[] eps, str names, Tensor cos, Tensor sin, Tensor written, Tensor lengths, int attending, int heads, "
        "int kv_heads, float scaling) -> Tensor");
}

// Every backend: the parts hold oneDNN's packed weights (MkldnnCPU tensors) beside plain CPU ones.
TORCH_LIBRARY_IMPL(EXTENSION_NAMESPACE, CompositeExplicitAutograd, m) { m.impl("decode_layers", &decode_layers); }
'''
# Its own code is plain C++; the ops it calls are built for AVX2 and up, so it is built and loaded where they are.
_CFLAGS = ["-O2", "-std=c++17", "-mavx2"]
EXTENSION = CompiledExtension("rag_decode_layers", _SOURCE, ["decode_layers"], _CFLAGS, frozenset({"avx2"}))


def op_namespaces() -> str:
    """The namespaces :func:`decode_layers` finds the ops it calls in, as its `names` argument: decode_glue's,
    ordered_attention's, then vnni_int8's, vnni_int4's, avx2_int8's, avx2_int4's and avx512_bf16's (each empty
    where not built)."""
    from pipeline.kernels import avx2_int4, avx2_int8, avx512_bf16, decode_glue, ordered_attention, vnni_int4, vnni_int8
    products = (e.name if e.ops() is not None else "" for e in (vnni_int8.EXTENSION, vnni_int4.EXTENSION,
                                                                 avx2_int8.EXTENSION, avx2_int4.EXTENSION,
                                                                 avx512_bf16.EXTENSION))
    return ";".join((decode_glue.EXTENSION.name, ordered_attention.EXTENSION.name, *products))


def product(linear: Any, dtype: Any) -> tuple[int, int, list[Any]] | None:
    """`linear` as :func:`decode_layers` multiplies by it over rows of `dtype`: (kind, output channels, its
    :data:`PRODUCT_PARTS` tensors, None-padded), the call the step's Python would make; None where the step
    would call anything else (the layers then run in Python)."""
    import torch

    from pipeline.kernels.batch_invariance import PackedBf16Linear, RowInvariantLinear
    from pipeline.kernels.int4 import Int4DynamicLinear
    from pipeline.kernels.int8 import Int8DynamicLinear
    kind = type(linear)
    if kind is RowInvariantLinear:  # the step runs a lone row as a pair where these are: always >= 2 rows
        found = ONEDNN, [linear._parameters["weight"], linear._parameters["bias"]]
    elif kind is PackedBf16Linear and dtype == torch.bfloat16:
        found = AVX512_BF16, [linear._parameters["weight"], linear._parameters["bias"]]
    elif kind is Int8DynamicLinear and dtype == torch.float32 and (int8 := linear.kernel_parts()) is not None:
        found = VNNI_INT8 if linear.kernel == "vnni" else AVX2_INT8, list(int8)
    elif kind is Int4DynamicLinear and dtype == torch.float32 and (int4 := linear.kernel_parts()) is not None:
        found = VNNI_INT4 if linear.kernel == "vnni" else AVX2_INT4, list(int4)
    else:
        return None
    kind_code, parts = found
    return kind_code, linear.out_features, parts + [None] * (PRODUCT_PARTS - len(parts))
