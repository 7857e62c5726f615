"""A Qwen2 decoder's decode step over the slot table on the CPU, in a fraction of transformers' ops.

transformers' forward spends a step's host time on glue, not on arithmetic: at one row and tiny widths
Qwen2's 24 layers dispatch about 3,970 aten ops (profiling/engine_overhead.py), most of them views,
no-op casts and the attention's mask work, the same for every layer of a step. This step computes the
same numbers with the same kernels in the same order (so the same bits: tests/unit/test_qwen2_step.py
compares it with the model's own forward in every precision), and does once what can be done once:

* per step: the rotary cos/sin, the attention's additive mask per key chunk and which chunks each row
  sees (the chunked attention's `_visible`/`bias`/`any` work, pipeline/kernels/chunked_attention.py);
* per (rows, width, slot layout), kept across steps: each layer's key/value chunk views of the slot
  table's buffers (they stay valid: the buffers are never reallocated);
* per layer only the arithmetic: RMSNorm's ops without its no-op casts, the Linears called on 2-d rows
  (a RowInvariantLinear straight into oneDNN), the rotary half-swap as one `roll` against a sign-folded
  sin ((-x2) * s and x2 * (-s) round alike), each new key and value written by one `index_put_`, one
  flash call per key chunk and the chunks merged as flash_chunked_attention merges them.

Only where it computes what the model's forward computes: a Qwen2ForCausalLM made batch-invariant
(pipeline.kernels.batch_invariance), full attention in every layer, the default rotary embedding, on
the CPU; otherwise :func:`qwen2_decode_step` returns None and the runner keeps the model's forward.
"""
from __future__ import annotations

from typing import Any

import torch

from pipeline.kernels.batch_invariance import BATCH_INVARIANT_ATTENTION, RowInvariantLinear, RowInvariantRMSNorm
from pipeline.kernels.chunked_attention import CHUNK, sum_in_order

# Chunk views kept per (rows, width, slots, capacity): a few layouts and widths at a time.
_VIEW_SETS = 64


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
        self.norm = inner.norm
        self.lm_head = model.lm_head
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.group = self.heads // self.kv_heads
        self.scaling = first.scaling
        self.rotary = inner.rotary_emb
        self._views: dict[tuple[int, int, bool, int, int], list[tuple[list[Any], list[Any]]]] = {}
        self._kv_head_index = torch.arange(self.kv_heads)[None, :]
        self._slot_0 = torch.zeros((2, 1), dtype=torch.long)  # a pair's rows both write slot 0 (the same values)

    # ------------------------------------------------------------------ pieces, each as the model's module computes it

    @staticmethod
    def _linear(linear, x):
        """`linear` over 2-d rows x: a RowInvariantLinear's oneDNN call itself (rows >= 2; its forward for one
        row), any other Linear (int8, int4) by its forward."""
        if type(linear) is RowInvariantLinear and x.shape[0] >= 2:
            return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, "none", [None], "")
        return linear(x)

    @staticmethod
    def _rms_norm(norm, x):
        """RowInvariantRMSNorm.forward on the CPU (per_row reduces at once there), the no-op casts left out."""
        dtype = x.dtype
        h = x if dtype == torch.float32 else x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * (h if dtype == torch.float32 else h.to(dtype))

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

    def _chunk_views(self, rows: int, width: int, pair: bool):
        """Per layer, its keys' and values' chunks (rows, kv heads, CHUNK, head size) of slots [0, rows) over
        columns [0, width): the views flash_chunked_attention cuts from the cache view the model attends over
        (a pair: slot 0's, twice)."""
        table = self.table
        key = (rows, width, pair, table.slots, table.capacity)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= _VIEW_SETS:
                self._views.clear()
            views = []
            for layer in range(len(self.layers)):
                pair_of = []
                for buffer in (table.keys[layer], table.values[layer]):
                    held = buffer[:1].expand(2, -1, -1, -1) if pair else buffer[:rows]
                    pair_of.append([held[:, :, c:c + CHUNK] for c in range(0, width, CHUNK)])
                views.append((pair_of[0], pair_of[1]))
            self._views[key] = views
        return views

    # ------------------------------------------------------------------ the step

    def ready(self) -> bool:
        """Whether every layer's K/V buffers exist (the first prefill allocates them)."""
        return len(self.table.keys) >= len(self.layers)

    def __call__(self, ids, columns, width: int):
        if width % CHUNK:
            raise ValueError(f"a decode step reads whole chunks of {CHUNK} columns, not {width}")
        # A lone row runs as two copies of itself (both reading and writing slot 0): a RowInvariantLinear
        # widens one row to two anyway, so the pair saves its widening and slicing at every Linear.
        pair = ids.shape[0] == 1
        if pair:
            ids, columns = ids.expand(2, 1), columns.expand(2)
        rows = ids.shape[0]
        hidden = torch.nn.functional.embedding(ids.reshape(rows), self.embed)
        dtype = hidden.dtype
        cos, sin = self._rotary(columns, dtype)
        # The attention's mask, as flash_chunked_attention builds it from the runner's `visible` (one query a row).
        visible = (torch.arange(width) <= columns[:, None])[:, None, None, :]
        bias = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
        biases = [bias[..., c:c + CHUNK] for c in range(0, width, CHUNK)]
        unseen = torch.stack([~visible[..., c:c + CHUNK].any(dim=-1) for c in range(0, width, CHUNK)])
        # Filling nothing is no change: where every row sees every chunk (one row always does) it is left out.
        unseen_any = bool(unseen.any())
        written = ((self._slot_0 if pair else torch.arange(rows)[:, None]), self._kv_head_index, columns[:, None])
        views = self._chunk_views(rows, width, pair)
        heads, kv_heads, group, dim, half = self.heads, self.kv_heads, self.group, self.head_dim, self.head_dim // 2
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        keys, values = self.table.keys, self.table.values
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = self._rms_norm(layer.input_layernorm, hidden)
            q = self._linear(attn.q_proj, x).view(rows, heads, dim)
            k = self._linear(attn.k_proj, x).view(rows, kv_heads, dim)
            v = self._linear(attn.v_proj, x).view(rows, kv_heads, dim)
            q = q * cos + torch.roll(q, half, -1) * sin
            k = k * cos + torch.roll(k, half, -1) * sin
            keys[index].index_put_(written, k)
            values[index].index_put_(written, v)
            q = q.view(rows, kv_heads, group, dim)
            outs, lses = [], []
            for kc, vc, mask in zip(*views[index], biases):
                out, lse = flash(q, kc, vc, attn_mask=mask, scale=self.scaling)
                outs.append(out)
                lses.append(lse)
            # flash_chunked_attention's merge: weights exp(lse - the row's largest), sums in chunk order in float64.
            lse = torch.stack(lses)
            if unseen_any:
                lse.masked_fill_(unseen, float("-inf"))
            top = lse.amax(dim=0)
            weights = lse.sub_(top.masked_fill_(top == float("-inf"), 0.0)).exp_().unsqueeze(-1)
            total = weights.cumsum(0)[-1]  # = sum_in_order: the CPU's cumsum adds in order in float64
            parts = [o * w for o, w in zip(outs, weights)] if dtype == torch.float32 else \
                [o.float() * w for o, w in zip(outs, weights)]
            out = sum_in_order(parts).div_(total.masked_fill_(total == 0, 1.0))
            out = (out if dtype == torch.float32 else out.to(dtype)).view(rows, heads * dim)
            hidden = hidden + self._linear(attn.o_proj, out)
            mlp = layer.mlp
            x = self._rms_norm(layer.post_attention_layernorm, hidden)
            x = mlp.act_fn(self._linear(mlp.gate_proj, x)) * self._linear(mlp.up_proj, x)
            hidden = hidden + self._linear(mlp.down_proj, x)
        logits = self._linear(self.lm_head, self._rms_norm(self.norm, hidden))
        return logits[:1] if pair else logits
