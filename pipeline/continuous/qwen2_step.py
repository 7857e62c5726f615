"""A Qwen2 decoder's decode step over the slot table on the CPU, in a fraction of transformers' ops.

transformers' forward spends a step's host time on glue, not on arithmetic: at one row and tiny widths
Qwen2's 24 layers dispatch about 3,970 aten ops (profiling/engine_overhead.py), most of them views,
no-op casts and the attention's mask work, the same for every layer of a step. This step computes the
same numbers with the same kernels in the same order (so the same bits: tests/unit/test_qwen2_step.py
compares it with the model's own forward in every precision), and does once what can be done once:

* per step: the rotary cos/sin and each row's key count (the ordered kernel), or the attention's additive
  mask per key chunk and which chunks each row sees (the chunked attention's `_visible`/`bias`/`any` work,
  pipeline/kernels/chunked_attention.py);
* per (rows, width, slot layout), kept across steps: each layer's key/value chunk views of the slot
  table's buffers (they stay valid: the buffers are never reallocated);
* per layer only the arithmetic: RMSNorm's ops without its no-op casts (where pipeline.kernels.decode_glue is
  built, one call with the residual add before it), the Linears called on 2-d rows
  (a RowInvariantLinear straight into oneDNN; q/k/v and gate/up one product each where they are fused,
  pipeline.kernels.fused_linears; where gate and up are, silu(gate) x up one glue call), the rotary
  half-swap as one `roll` against a sign-folded sin ((-x2) * s and x2 * (-s) round alike) over q's and
  k's heads at once (side by side in the fused product), each new key and value written by one
  `index_copy_` (where decode_glue is built, the rotary and both writes one call, the same bits), and one
  attention call: where pipeline.kernels.ordered_attention is built, that kernel over each row's own keys (up to its column,
  read in place from the slot table), else one flash call over all key chunks (each chunk one of the
  kernel's heads: each chunk's bits as its own call gives them) and the chunks merged as
  flash_chunked_attention merges them; in place where a result is the op's own fresh tensor
  (an in-place op rounds as its out-of-place twin). A lone row runs as a pair through the Linears where
  they are RowInvariantLinears (their own widening; a quantized Linear takes it alone) but is rotated and
  attends once;
* every layer in one C++ call where those kernels are built and the products are ones it calls
  (pipeline.kernels.decode_layers: the same ops in the same order, none of Python's ~4 µs a custom op call).

Only where it computes what the model's forward computes: a Qwen2ForCausalLM made batch-invariant
(pipeline.kernels.batch_invariance), full attention in every layer, the default rotary embedding, on
the CPU; otherwise :func:`qwen2_decode_step` returns None and the runner keeps the model's forward.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from pipeline.kernels import decode_layers
from pipeline.kernels.batch_invariance import BATCH_INVARIANT_ATTENTION, RowInvariantLinear, RowInvariantRMSNorm
from pipeline.kernels.chunked_attention import CHUNK, ORDERED, chunk_masks, decode_attention
from pipeline.kernels.decode_glue import EXTENSION as GLUE
from pipeline.kernels.fused_linears import FusedPart
from pipeline.kernels.int4 import Int4DynamicLinear
from pipeline.kernels.int8 import PACKED_KERNELS, Int8DynamicLinear

# Chunk views kept per (rows, width, slots, capacity): a few layouts and widths at a time.
_VIEW_SETS = 64
_GLUE_OPS = ("rotate_and_store", "rms_norm", "add_rms_norm", "silu_mul")  # decode_glue's, as the step calls them


class _Norm(NamedTuple):
    """What a norm's arithmetic reads (RowInvariantRMSNorm's names), looked up once: nn.Module's own attribute
    lookup costs about a microsecond each time, hundreds of times a step."""
    weight: torch.Tensor
    variance_epsilon: float


class _Layer(NamedTuple):
    """A decoder layer's parts as the step calls them, looked up once (as :class:`_Norm`)."""
    input_norm: _Norm
    attn: Any
    qkv: Any  # where q/k/v are fused (pipeline.kernels.fused_linears): the one Linear; else None (attn's own)
    o_proj: Any
    post_norm: _Norm
    mlp: Any
    gate_up: Any  # where gate/up are fused: the one Linear; else None (mlp's own)
    down: Any

    @classmethod
    def of(cls, layer) -> "_Layer":
        attn, mlp = layer.self_attn, layer.mlp
        qkv = attn.q_proj.fused.linear if type(attn.q_proj) is FusedPart else None
        gate_up = mlp.gate_proj.fused.linear if type(mlp.gate_proj) is FusedPart else None
        return cls(_norm(layer.input_layernorm), attn, qkv, attn.o_proj, _norm(layer.post_attention_layernorm), mlp,
                   gate_up, mlp.down_proj)


class _OneCall(NamedTuple):
    """What pipeline.kernels.decode_layers takes besides a step's tensors, built once (four products a layer)."""
    kinds: list[int]
    channels: list[int]
    eps: list[float]
    names: str
    products: list[list[Any]]


def _norm(norm) -> _Norm:
    return _Norm(norm.weight, norm.variance_epsilon)


def qwen2_decode_step(model, table) -> "Qwen2DecodeStep | None":
    """The fast decode step for `model` over `table`, or None where it would not compute exactly what the
    model's forward does (another architecture or configuration, another device, not batch-invariant)."""
    from transformers import Qwen2ForCausalLM
    if type(model) is not Qwen2ForCausalLM or table.device != "cpu" or model.training:
        return None
    config, inner = model.config, model.model
    if (config._attn_implementation != BATCH_INVARIANT_ATTENTION
            or any(kind != "full_attention" for kind in (config.layer_types or [])[:config.num_hidden_layers])
            or inner.rotary_emb.rope_type != "default"
            or next(model.parameters()).device.type != "cpu"):
        return None
    norms = [inner.norm] + [n for layer in inner.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    if any(type(norm) is not RowInvariantRMSNorm for norm in norms):
        return None
    return Qwen2DecodeStep(model, table)


class Qwen2DecodeStep:
    """`step(ids, columns, width)` -> logits: the runner's eager decode step (ModelRunner._forward's contract:
    (rows, 1) ids at (rows,) columns of slots [0, rows), reading columns [0, width) -> (rows, vocab))."""

    def __init__(self, model, table):
        inner = model.model
        self.table = table
        self.embed = inner.embed_tokens.weight
        self.layers = list(inner.layers[:model.config.num_hidden_layers])
        self.norm = _norm(inner.norm)
        self.lm_head = model.lm_head
        self._plan = [_Layer.of(layer) for layer in self.layers]
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.group = self.heads // self.kv_heads
        self.scaling = first.scaling
        self.rotary = inner.rotary_emb
        # Whether a lone row runs as a pair: only a RowInvariantLinear widens one row to two itself.
        self._pairs = any(type(m) is RowInvariantLinear for m in (*inner.layers.modules(), model.lm_head))
        # Whether the MLP's activation is torch's silu (decode_glue's `silu_mul` calls it).
        from transformers.activations import SiLUActivation
        self._silu = all(type(layer.mlp.act_fn) in (torch.nn.SiLU, SiLUActivation) for layer in self.layers)
        self._views: dict[tuple[int, int, int, int], tuple[Any, list[tuple[Any, ...]], list[Any]]] = {}
        self._compiled = self._compiled_layers()
        # the one call multiplies by their VNNI copies: where one is switched to another kernel, Python loops
        self._int8 = [m for layer in self._plan for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
                      if type(m) is Int8DynamicLinear]

    @property
    def layers_in_one_call(self) -> bool:
        """Whether a step runs every layer in one call (pipeline.kernels.decode_layers) rather than in Python:
        where its layers are what that call computes and it and every op it calls are built (asked at every
        step, as the other kernels are)."""
        kernels = (ORDERED.registered("ordered_attention"), *(GLUE.registered(op) for op in _GLUE_OPS))
        return self._one_call(None not in kernels) is not None

    def _one_call(self, kernels_built: bool) -> Any:
        """decode_layers' op where a step runs its layers in one call, else None (:attr:`layers_in_one_call`);
        `kernels_built`: whether the ordered attention and every glue op it calls are."""
        if not kernels_built or self._compiled is None or any(m.kernel not in PACKED_KERNELS for m in self._int8):
            return None
        return decode_layers.EXTENSION.registered("decode_layers")

    def _compiled_layers(self) -> _OneCall | None:
        """What pipeline.kernels.decode_layers needs to run every layer in one call, or None where a layer is not
        what it computes (q/k/v or gate/up unfused, an activation other than silu, a product it does not call)."""
        if not self._silu:
            return None
        kinds, channels, eps, products = [], [], [], []
        for layer in self._plan:
            maybe = [decode_layers.product(linear, self.embed.dtype)
                     for linear in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
            found = [one for one in maybe if one is not None]
            if len(found) < len(maybe):
                return None
            kinds += [one[0] for one in found]
            channels += [one[1] for one in found]
            eps += [layer.input_norm.variance_epsilon, layer.post_norm.variance_epsilon]
            products.append([part for one in found for part in one[2]])
        return _OneCall(kinds, channels, eps, decode_layers.op_namespaces(), products)

    # ------------------------------------------------------------------ pieces, each as the model's module computes it

    @staticmethod
    def _linear(linear, x):
        """`linear` over 2-d rows x: a RowInvariantLinear's oneDNN call itself (rows >= 2; its forward for one
        row), an int8-dynamic or int4-dynamic Linear's product over float32 rows itself, any other (int4-weight)
        by its forward."""
        kind = type(linear)
        if kind is RowInvariantLinear and x.shape[0] >= 2:
            parameters = linear._parameters  # read directly: nn.Module's attribute lookup costs ~1 µs a time
            return torch.ops.mkldnn._linear_pointwise(x, parameters["weight"], parameters["bias"], "none", [None], "")
        if (kind is Int8DynamicLinear or kind is Int4DynamicLinear) and x.dtype == torch.float32:
            return linear.multiply(x)
        return linear(x)

    def _query_key_value(self, layer: _Layer, x, rows: int):
        """q_proj's and k_proj's columns side by side for the first `rows` rows, (rows, heads + kv heads, head
        size), and v_proj's (rows, kv heads x head size): where they are fused (pipeline.kernels.fused_linears)
        one product, q's and k's columns already side by side in it."""
        if layer.qkv is not None:
            qkv = self._linear(layer.qkv, x)
            qk_width = (self.heads + self.kv_heads) * self.head_dim
            qk, v = qkv.split((qk_width, qkv.shape[1] - qk_width), dim=-1)
        else:
            attn = layer.attn
            qk, v = torch.cat((self._linear(attn.q_proj, x), self._linear(attn.k_proj, x)), dim=-1), self._linear(attn.v_proj, x)
        if rows < x.shape[0]:  # a pair's second row: the same as its first
            qk, v = qk[:rows], v[:rows]
        return qk.view(rows, self.heads + self.kv_heads, self.head_dim), v

    def _gate_up(self, layer: _Layer, x):
        """gate_proj's and up_proj's products: one, split in halves, where they are fused."""
        if layer.gate_up is not None:
            gate_up = self._linear(layer.gate_up, x)
            width = gate_up.shape[1] // 2
            return gate_up.split((width, width), dim=-1)
        return self._linear(layer.mlp.gate_proj, x), self._linear(layer.mlp.up_proj, x)

    @staticmethod
    def _rms_norm(norm, x, glued=None):
        """RowInvariantRMSNorm.forward on the CPU (per_row reduces at once there), the no-op casts left out;
        decode_glue's `rms_norm` where given (one call, the same bits)."""
        if glued is not None:
            return glued(x, norm.weight, norm.variance_epsilon)
        dtype = x.dtype
        h = x if dtype == torch.float32 else x.to(torch.float32)
        h = h * h.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()  # x itself left as it is
        return (h if dtype == torch.float32 else h.to(dtype)).mul_(norm.weight)  # w * h == h * w

    @classmethod
    def _add_rms_norm(cls, norm, hidden, delta, glued=None, glued_add=None):
        """hidden += delta in place (where delta is not None), then the norm of hidden: decode_glue's
        `add_rms_norm` where given (one call, the same bits)."""
        if delta is None:
            return cls._rms_norm(norm, hidden, glued)
        if glued_add is not None:
            return glued_add(hidden, delta, norm.weight, norm.variance_epsilon)
        hidden.add_(delta)
        return cls._rms_norm(norm, hidden, glued)

    def _rotary(self, columns, dtype):
        """Qwen2RotaryEmbedding's cos and sin at each row's position, (rows, 1, head size), and the sin with its
        first half negated: rotate_half(x) * sin == roll(x, half) * that."""
        rotary = self.rotary
        freqs = columns[:, None, None].float() * rotary.inv_freq.to(dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if rotary.attention_scaling != 1.0:  # x * 1.0 is x: left out where it is 1
            cos, sin = cos * rotary.attention_scaling, sin * rotary.attention_scaling
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        half = self.head_dim // 2
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _cache_views(self, rows: int, width: int):
        """The step's views of the slot table's buffers: the (rows, kv heads) offset of each row's head in a
        layer's flat (slots x kv heads x capacity, head size) buffer, and per layer that flat buffer for keys
        and for values and their chunks of slots [0, rows) over columns [0, width), (rows x kv heads, chunks,
        CHUNK, head size): the chunks flash_chunked_attention cuts from the cache view the model attends
        over (a slot's kv heads are one capacity apart, the slots too), and the buffer's slots [0, rows)
        themselves, (rows, kv heads, capacity, head size), what the ordered kernel reads; and where the layers
        run in one call, its parts list (pipeline.kernels.decode_layers.PER_LAYER a layer)."""
        table = self.table
        key = (rows, width, table.slots, table.capacity)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= _VIEW_SETS:
                self._views.clear()
            offsets = (torch.arange(rows)[:, None] * self.kv_heads + torch.arange(self.kv_heads)[None, :]) * table.capacity
            layers = []
            for layer in range(len(self.layers)):
                per: list[Any] = []
                for buffer in (table.keys[layer], table.values[layer]):
                    flat = buffer.view(-1, self.head_dim)
                    heads = buffer[:rows].view(rows * self.kv_heads, table.capacity, self.head_dim)
                    per += [flat, heads[:, :width].unflatten(1, (width // CHUNK, CHUNK)), buffer[:rows]]
                layers.append(tuple(per))
            parts: list[Any] = []
            if self._compiled is not None:
                for plan, cached, products in zip(self._plan, layers, self._compiled.products):
                    parts += [plan.input_norm.weight, plan.post_norm.weight, *cached[0:4:2], *cached[3:6:2], *products]
            views = self._views[key] = (offsets, layers, parts)
        return views

    # ------------------------------------------------------------------ the step

    def ready(self) -> bool:
        """Whether every layer's K/V buffers exist (the first prefill allocates them)."""
        return len(self.table.keys) >= len(self.layers)

    def __call__(self, ids, columns, width: int):
        if width % CHUNK:
            raise ValueError(f"a decode step reads whole chunks of {CHUNK} columns, not {width}")
        # A lone row runs as two copies of itself (both reading and writing slot 0) where a RowInvariantLinear
        # is among the Linears: it widens one row to two anyway, so the pair saves its widening and slicing.
        pair = ids.shape[0] == 1 and self._pairs
        if pair:
            ids, columns = ids.expand(2, 1), columns.expand(2)
        rows = ids.shape[0]
        hidden = torch.nn.functional.embedding(ids.reshape(rows), self.embed)
        dtype = hidden.dtype
        # A pair's rows are one row twice: it is rotated and attends once, over slot 0, its output serving both.
        attending = 1 if pair else rows
        cos, sin = self._rotary(columns[:attending], dtype)
        # The ordered kernel reads each row's keys up to its own column; the chunked one needs masks per chunk
        # (as flash_chunked_attention builds them from the runner's `visible`, one query a row).
        # the step runs on the CPU only (qwen2_decode_step): the kernel where built, as chunked_attention chooses
        ordered = ORDERED.registered("ordered_attention")
        rotate, rms = GLUE.registered("rotate_and_store"), GLUE.registered("rms_norm")  # None where not built
        add_rms, silu_mul = GLUE.registered("add_rms_norm"), GLUE.registered("silu_mul")
        if ordered is not None:
            lengths = columns[:attending] + 1
        else:
            bias, unseen = chunk_masks((torch.arange(width) <= columns[:attending, None])[:, None, None, :], dtype,
                                       self.kv_heads)
        offsets, views, flat = self._cache_views(attending, width)
        written = (offsets + columns[:attending, None]).view(-1)  # each row's new column of each kv head
        heads, kv_heads, group, dim, half = self.heads, self.kv_heads, self.group, self.head_dim, self.head_dim // 2
        # every layer in one call (the same ops in the same order), but where a dispatch mode is on (a profiling
        # tool recording or counting ops), which would see the one call as one op in inference mode
        one_call = self._one_call(None not in (ordered, rotate, rms, add_rms, silu_mul))
        if one_call is not None and self._compiled is not None and _get_current_dispatch_mode() is None:
            plan = self._compiled
            delta = one_call(hidden, flat, plan.kinds, plan.channels, plan.eps, plan.names, cos, sin, written,
                             lengths, attending, heads, kv_heads, self.scaling)
        else:
            delta = None  # what the residual stream adds before the next norm (none before the first layer's)
            for index, layer in enumerate(self._plan):
                x = self._add_rms_norm(layer.input_norm, hidden, delta, rms, add_rms)
                qk, v = self._query_key_value(layer, x, attending)
                keys, key_chunks, key_slots, values, value_chunks, value_slots = views[index]
                if rotate is not None:  # q returned rotated, (rows, heads, 1, head size); k and v written
                    q = rotate(qk, v, cos, sin, keys, values, written, heads)
                else:
                    qk = (qk * cos).add_(torch.roll(qk, half, -1).mul_(sin))  # every q and k head rotated in one pass
                    keys.index_copy_(0, written, qk[:, heads:].reshape(-1, dim))
                    values.index_copy_(0, written, v.reshape(-1, dim))
                    q = qk[:, :heads].unsqueeze(2)
                if ordered is not None:
                    out = ordered(q, key_slots, value_slots, None, lengths, True, self.scaling).view(attending, heads * dim)
                else:
                    out = decode_attention(q.view(attending, kv_heads, group, dim), key_chunks, value_chunks,
                                           bias, unseen, self.scaling).view(attending, heads * dim)
                if pair:
                    out = out.expand(2, -1)
                x = self._add_rms_norm(layer.post_norm, hidden, self._linear(layer.o_proj, out), rms, add_rms)
                if silu_mul is not None and self._silu and layer.gate_up is not None:  # one product, one call
                    x = silu_mul(self._linear(layer.gate_up, x))
                else:
                    gate, up = self._gate_up(layer, x)
                    x = layer.mlp.act_fn(gate).mul_(up)
                delta = self._linear(layer.down, x)
        logits = self._linear(self.lm_head, self._add_rms_norm(self.norm, hidden, delta, rms, add_rms))
        return logits[:1] if pair else logits
