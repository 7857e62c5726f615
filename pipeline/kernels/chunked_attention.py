"""Attention over a padded batch in one pass, each row's result independent of the others and of padding.

The key axis is cut into chunks of :data:`CHUNK` keys, a size fixed whatever the batch and the padded
width, counted from each row's real keys: forward from the first key where every row starts at
column 0 (``padded_on="right"``), back from the newest key where every row ends at the last column
(``padded_on="left"``, transformers' left padding). A row alone and the same row in a batch meet
the same chunks holding the same keys at the same places; a chunk the row does not reach is all
padding. Every sum over keys then runs in an order fixed by the row's own keys: within a chunk by
a kernel of one fixed shape, batched over rows and heads, and across chunks one after another
(cumsum: sequential), a chunk of padding adding exact zeros. A softmax's maximum is exact in any
order. Sums over all keys at once are not invariant: MKL's float32 product and the vectorized
softmax sums group a row's keys by their column, which padding shifts (docs/performance.md,
"Loop-free decode attention").

Counted from the first key, the chunks are also the same however a prompt is cut into pieces: a
query attends over the same chunks whether it comes in a prefill of the whole prompt, in a piece
of one token, or as a decode step. Counted from the newest key they move with the newest key, so
``"left"`` only promises invariance to the batch.

Two ways to compute a chunk, one result contract:

* :func:`flash_chunked_attention` (the CPU): SDPA's CPU flash kernel, one call per chunk for the
  whole batch, its outputs merged by their log-sum-exps; float32 inside like SDPA.
* :func:`matmul_chunked_attention` (any device): each chunk's query x key and probability x value
  products as batched matrix products of one fixed shape, in the inputs' dtype like transformers'
  eager attention (bfloat16 scores are rounded to bfloat16 before the float32 softmax).

Grouped-query attention without copying keys: kv head j serves query heads j*g .. j*g+g-1 (g =
heads / kv heads, as transformers' repeat_kv), so a kv head's g query heads ride as g x queries
query rows against it.
"""
from __future__ import annotations

import torch

CHUNK = 256  # keys per chunk: a multiple of 64 (whole vectors for every kernel); 2 to 5 chunks a decode step


def _key_chunks(t: torch.Tensor, lead: int, chunk: int, padded_on: str) -> list[torch.Tensor]:
    """`t` (n, keys, d) cut into (n, chunk, d) pieces: views, and a zero-padded copy of the partial
    chunk (`lead` columns before the first key, or after the last)."""
    keys = t.shape[1]
    if not lead:
        return [t[:, c:c + chunk] for c in range(0, keys, chunk)]
    if padded_on == "left":
        first = torch.nn.functional.pad(t[:, :chunk - lead], (0, 0, lead, 0))
        return [first] + [t[:, c:c + chunk] for c in range(chunk - lead, keys, chunk)]
    last = torch.nn.functional.pad(t[:, keys - (chunk - lead):], (0, 0, 0, lead))
    return [t[:, c:c + chunk] for c in range(0, keys - (chunk - lead), chunk)] + [last]


def _visible(mask: torch.Tensor | None, is_causal: bool, queries: int, keys: int, lead: int, padded_on: str,
             device: torch.device) -> torch.Tensor:
    """Bool (rows or 1, 1, queries or 1, chunks x chunk): which key each query sees, on the chunked axis."""
    if padded_on not in ("left", "right"):
        raise ValueError(f"padded_on must be 'left' or 'right', not {padded_on!r}")
    if mask is not None:
        visible = mask.reshape(mask.shape[0] if mask.dim() == 4 else 1, 1, *mask.shape[-2:])
    elif is_causal and queries > 1:
        to = torch.arange(keys - queries, keys, device=device)[:, None]  # query i is key keys - queries + i
        visible = (torch.arange(keys, device=device)[None, :] <= to)[None, None]
    else:
        visible = torch.ones((1, 1, 1, keys), dtype=torch.bool, device=device)
    return torch.nn.functional.pad(visible, (lead, 0) if padded_on == "left" else (0, lead), value=False)


def flash_chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            mask: torch.Tensor | None = None, *, scaling: float, is_causal: bool = False,
                            padded_on: str = "left", chunk: int = CHUNK) -> torch.Tensor:
    """:func:`chunked_attention` on the CPU: each chunk one call of SDPA's CPU flash kernel (its output
    and log-sum-exp), the chunks merged in order, weighted by exp(log-sum-exp - the row's largest)."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    lead = -keys % chunk
    visible = _visible(mask, is_causal, queries, keys, lead, padded_on, query.device)
    if visible.shape[2] > 1:
        visible = visible.repeat(1, 1, group, 1)  # query row g * queries + i is query i of head g
    bias = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill_(~visible, float("-inf"))
    q = query.reshape(rows, kv_heads, group * queries, dim)
    k, v = key.reshape(rows * kv_heads, keys, dim), value.reshape(rows * kv_heads, keys, dim)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    outs, lses = [], []
    for c, (kc, vc) in enumerate(zip(_key_chunks(k, lead, chunk, padded_on), _key_chunks(v, lead, chunk, padded_on))):
        cols = slice(c * chunk, (c + 1) * chunk)
        out, lse = flash(q, kc.view(rows, kv_heads, chunk, dim), vc.view(rows, kv_heads, chunk, dim),
                         attn_mask=bias[..., cols], scale=scaling)
        outs.append(out)
        # The kernel gives a query that sees nothing in the chunk zeros and a log-sum-exp of 0: weight 0.
        lses.append(lse.masked_fill(~visible[..., cols].any(dim=-1), float("-inf")).expand(rows, kv_heads, -1))
    lse = torch.stack(lses)  # (chunks, rows, kv heads, group x queries)
    top = lse.amax(dim=0)
    weights = lse.sub_(top.masked_fill_(top == float("-inf"), 0.0)).exp_().unsqueeze(-1)
    total = weights.cumsum(dim=0)[-1]
    out = torch.stack(outs).float().mul_(weights).cumsum(dim=0)[-1].div_(total.masked_fill_(total == 0, 1.0))
    return out.view(rows, heads, queries, dim).to(query.dtype)


def matmul_chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: torch.Tensor | None = None, *, scaling: float, is_causal: bool = False,
                             padded_on: str = "left", chunk: int = CHUNK) -> torch.Tensor:
    """:func:`chunked_attention` with batched matrix products of one fixed shape per chunk (any device):
    the row's maximum over all its keys subtracted, exp summed per chunk, chunks added in order."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    lead = -keys % chunk
    n = (keys + lead) // chunk
    visible = _visible(mask, is_causal, queries, keys, lead, padded_on, query.device)
    q = query.reshape(rows * kv_heads, group * queries, dim)
    k, v = key.reshape(rows * kv_heads, keys, dim), value.reshape(rows * kv_heads, keys, dim)
    scores = torch.cat([torch.bmm(q, part.transpose(1, 2)) for part in _key_chunks(k, lead, chunk, padded_on)], dim=2)
    scores = scores.float().mul_(scaling).view(rows, kv_heads, group, queries, n * chunk)
    scores.masked_fill_(~visible.unsqueeze(2), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    weights = scores.sub_(top.masked_fill_(top == float("-inf"), 0.0)).exp_()  # unseen keys: exactly 0
    weights = weights.view(rows * kv_heads, group * queries, n, chunk)
    total = weights.sum(dim=-1).cumsum(dim=-1)[..., -1:]  # (rows x kv heads, group x queries, 1)
    probs = weights.to(value.dtype)
    parts = [torch.bmm(probs[:, :, c], part) for c, part in enumerate(_key_chunks(v, lead, chunk, padded_on))]
    out = torch.stack(parts).float().cumsum(dim=0)[-1].div_(total.masked_fill_(total == 0, 1.0))
    return out.view(rows, heads, queries, dim).to(query.dtype)


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                      *, scaling: float, is_causal: bool = False, padded_on: str = "left",
                      chunk: int = CHUNK) -> torch.Tensor:
    """Attention of `query` over `key`/`value`, every row exactly as it would be alone.

    query (rows, heads, queries, head size); key and value (rows, kv heads, keys, head size), any
    strides along rows and keys (a view of a cache with spare columns is read in place);
    `mask` None or bool broadcastable to (rows, 1, queries, keys), True where a query sees a key;
    `is_causal` (with no mask): query i is key keys - queries + i and sees the keys up to it.
    `padded_on`: "right" where every row's first key is column 0, "left" where every row's newest
    key is the last column. Returns (rows, heads, queries, head size) in the query's dtype; a query
    that sees no key gets zeros. On the CPU :func:`flash_chunked_attention`, elsewhere
    :func:`matmul_chunked_attention` (their results differ in rounding: one device, one kernel)."""
    attend = flash_chunked_attention if query.device.type == "cpu" else matmul_chunked_attention
    return attend(query, key, value, mask, scaling=scaling, is_causal=is_causal, padded_on=padded_on, chunk=chunk)


def chunked_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """:func:`chunked_attention` as a transformers attention function (AttentionInterface), for a
    left-padded batch: `attention_mask` None or the bool mask `sdpa_mask` builds. Returns
    ((rows, queries, heads, head size), None) like transformers' sdpa_attention_forward."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    causal = attention_mask is None and getattr(module, "is_causal", True)
    out = chunked_attention(query, key, value, attention_mask, scaling=scale, is_causal=causal, padded_on="left")
    return out.transpose(1, 2).contiguous(), None
