"""Attention over a padded batch in one pass, each row's result independent of the others and of padding.

On a CPU where it is built, :func:`chunked_attention` runs pipeline.kernels.ordered_attention (each
query's keys summed first to last, no chunks), for a decode step and for a prompt's queries alike; the
chunked kernels below serve CUDA's decode steps and a CPU without it.

Every row's keys start at column 0 (padding, if any, after its last key). The key axis is cut into
chunks of :data:`CHUNK` keys, a size fixed whatever the batch and the padded width, counted from
column 0: a row alone and the same row in a batch meet the same chunks holding the same keys at
the same places; a chunk the row does not reach is all padding. Every sum over keys then runs in
an order fixed by the row's own keys: within a chunk by a kernel of one fixed shape, batched over
rows and heads, and across chunks by :func:`sum_in_order`, a loop adding the chunks one after
another, first to last, in float64 (a chunk of padding after the row's last key adds exact zeros,
so it changes nothing). A softmax's maximum is exact in any order. Sums over all keys at once are
not invariant: MKL's float32 product and the vectorized softmax sums group a row's keys by their
column, which padding shifts (docs/performance.md, "Loop-free decode attention"); nor is a scan
along the chunks, which CUDA runs as a tree whose shape follows the padded chunk count.

Counted from the first key, the chunks are also the same however a prompt is cut into pieces: a
query attends over the same chunks whether it comes in a prefill of the whole prompt, in a piece
of one token, or as a decode step. A left-padded batch (transformers' generate) is first turned
into this layout, each row's keys moved to column 0 (:func:`chunked_attention_forward`).

Two ways to compute a chunk, one result contract:

* :func:`flash_chunked_attention` (the CPU): SDPA's CPU flash kernel, one call per chunk for the
  whole batch, its outputs merged by their log-sum-exps; float32 inside like SDPA. The CPU kernels
  give every (row, head) the same arithmetic whatever the row count (tests/unit/test_chunked_attention.py).
* :func:`matmul_chunked_attention` (any device; what CUDA runs): the rows in tiles of exactly
  :data:`TILE_ROWS` (the last one zero-padded), so that every launch (the products, the sums within
  a chunk) has one shape whatever the batch: CUDA's reductions and cuBLAS choose their split of a
  sum by the shape they are given. Each chunk's query x key and probability x value products are
  batched matrix products, in the inputs' dtype like transformers' eager attention (bfloat16 scores
  are rounded to bfloat16 before the float32 softmax).

Grouped-query attention without copying keys: kv head j serves query heads j*g .. j*g+g-1 (g =
heads / kv heads, as transformers' repeat_kv), so a kv head's g query heads ride as g x queries
query rows against it.
"""
from __future__ import annotations

import torch

from pipeline.kernels.ordered_attention import EXTENSION as ORDERED
from pipeline.kernels.ordered_attention import ordered_attention

CHUNK = 256  # keys per chunk: a multiple of 64 (whole vectors for every kernel); 2 to 5 chunks a decode step
# Rows per launch of matmul_chunked_attention: one tile for every decode bucket up to 32 rows
# (pipeline.continuous.cuda_graphs), so a step's kernel count does not grow with its rows there;
# a step of fewer rows copies its keys and values into a tile with zero rows after them.
TILE_ROWS = 32


def sum_in_order(parts) -> torch.Tensor:
    """The float32 sum of `parts` (tensors of one shape), added one after another, first to last, in
    float64 and rounded once: the order is fixed by the list, on every device (the bits the CPU's
    cumsum gives, which accumulates in float64)."""
    total = parts[0].to(torch.float64, copy=True)
    for part in parts[1:]:
        total.add_(part)  # in float64: the part is widened exactly
    return total.float()


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero (False) rows appended up to `rows`."""
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))]) if t.shape[0] < rows else t


def _key_chunks(t: torch.Tensor, pad: int, chunk: int) -> list[torch.Tensor]:
    """`t` (n, keys, d) cut into (n, chunk, d) pieces: views, and a zero-padded copy of the last
    chunk where `pad` columns are missing from it."""
    keys = t.shape[1]
    if not pad:
        return [t[:, c:c + chunk] for c in range(0, keys, chunk)]
    last = torch.nn.functional.pad(t[:, keys - (chunk - pad):], (0, 0, 0, pad))
    return [t[:, c:c + chunk] for c in range(0, keys - (chunk - pad), chunk)] + [last]


def _visible(mask: torch.Tensor | None, is_causal: bool, queries: int, keys: int, pad: int,
             device: torch.device) -> torch.Tensor:
    """Bool (rows or 1, 1, queries or 1, chunks x chunk): which key each query sees, on the chunked axis."""
    if mask is not None:
        visible = mask.reshape(mask.shape[0] if mask.dim() == 4 else 1, 1, *mask.shape[-2:])
    elif is_causal and queries > 1:
        to = torch.arange(keys - queries, keys, device=device)[:, None]  # query i is key keys - queries + i
        visible = (torch.arange(keys, device=device)[None, :] <= to)[None, None]
    else:
        visible = torch.ones((1, 1, 1, keys), dtype=torch.bool, device=device)
    return torch.nn.functional.pad(visible, (0, pad), value=False)


def flash_chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            mask: torch.Tensor | None = None, *, scaling: float, is_causal: bool = False,
                            chunk: int = CHUNK) -> torch.Tensor:
    """:func:`chunked_attention` on the CPU: each chunk one call of SDPA's CPU flash kernel (its output
    and log-sum-exp), the chunks merged in order, weighted by exp(log-sum-exp - the row's largest)."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    pad = -keys % chunk
    visible = _visible(mask, is_causal, queries, keys, pad, query.device)
    if visible.shape[2] > 1:
        visible = visible.repeat(1, 1, group, 1)  # query row g * queries + i is query i of head g
    bias = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill_(~visible, float("-inf"))
    q = query.reshape(rows, kv_heads, group * queries, dim)
    k, v = key.reshape(rows * kv_heads, keys, dim), value.reshape(rows * kv_heads, keys, dim)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    outs, lses = [], []
    for c, (kc, vc) in enumerate(zip(_key_chunks(k, pad, chunk), _key_chunks(v, pad, chunk))):
        cols = slice(c * chunk, (c + 1) * chunk)
        out, lse = flash(q, kc.view(rows, kv_heads, chunk, dim), vc.view(rows, kv_heads, chunk, dim),
                         attn_mask=bias[..., cols], scale=scaling)
        outs.append(out)
        # The kernel gives a query that sees nothing in the chunk zeros and a log-sum-exp of 0: weight 0.
        lses.append(lse.masked_fill(~visible[..., cols].any(dim=-1), float("-inf")).expand(rows, kv_heads, -1))
    lse = torch.stack(lses)  # (chunks, rows, kv heads, group x queries)
    top = lse.amax(dim=0)
    weights = lse.sub_(top.masked_fill_(top == float("-inf"), 0.0)).exp_().unsqueeze(-1)
    total = sum_in_order(weights.unbind(0))
    out = sum_in_order([o.float() * w for o, w in zip(outs, weights)]).div_(total.masked_fill_(total == 0, 1.0))
    return out.view(rows, heads, queries, dim).to(query.dtype)


def matmul_chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: torch.Tensor | None = None, *, scaling: float, is_causal: bool = False,
                             chunk: int = CHUNK, tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """:func:`chunked_attention` with batched matrix products of one fixed shape per chunk (any device),
    over tiles of exactly `tile_rows` rows: the row's maximum over all its keys subtracted, exp summed
    per chunk, the chunks' sums and products added in order (:func:`sum_in_order`)."""
    rows, queries, keys = query.shape[0], query.shape[2], key.shape[2]
    visible = _visible(mask, is_causal, queries, keys, -keys % chunk, query.device)  # (rows or 1, 1, q or 1, cols)
    tiles = []
    for start in range(0, rows, tile_rows):
        end = min(rows, start + tile_rows)
        q, k, v = (_padded_rows(t[start:end], tile_rows) for t in (query, key, value))
        sees = _padded_rows(visible[start:end], tile_rows) if visible.shape[0] > 1 else visible  # padding: nothing
        tiles.append(_matmul_tile(q, k, v, sees, scaling, chunk))
    out = tiles[0] if len(tiles) == 1 else torch.cat(tiles)
    return out[:rows]


def _matmul_tile(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor,
                 scaling: float, chunk: int) -> torch.Tensor:
    """matmul_chunked_attention over one tile of rows; `visible` as _visible gives it."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    pad = -keys % chunk
    hidden = ~visible.unsqueeze(2)  # broadcasts over (rows, kv heads, group, queries, chunk)
    q = query.reshape(rows * kv_heads, group * queries, dim)
    k, v = key.reshape(rows * kv_heads, keys, dim), value.reshape(rows * kv_heads, keys, dim)
    scores = []
    for c, part in enumerate(_key_chunks(k, pad, chunk)):
        s = torch.bmm(q, part.transpose(1, 2)).float().mul_(scaling).view(rows, kv_heads, group, queries, chunk)
        scores.append(s.masked_fill_(hidden[..., c * chunk:(c + 1) * chunk], float("-inf")))
    top = scores[0].amax(dim=-1, keepdim=True)
    for s in scores[1:]:
        top = torch.maximum(top, s.amax(dim=-1, keepdim=True))  # a maximum is exact in any order
    top.masked_fill_(top == float("-inf"), 0.0)
    sums, parts = [], []
    for s, part in zip(scores, _key_chunks(v, pad, chunk)):
        weights = s.sub_(top).exp_().view(rows * kv_heads, group * queries, chunk)  # unseen keys: exactly 0
        sums.append(weights.sum(dim=-1, keepdim=True))
        parts.append(torch.bmm(weights.to(value.dtype), part))
    total = sum_in_order(sums)  # (rows x kv heads, group x queries, 1)
    out = sum_in_order(parts).div_(total.masked_fill_(total == 0, 1.0))
    return out.view(rows, heads, queries, dim).to(query.dtype)


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                      *, scaling: float, is_causal: bool = False, chunk: int = CHUNK) -> torch.Tensor:
    """Attention of `query` over `key`/`value`, every row exactly as it would be alone.

    query (rows, heads, queries, head size); key and value (rows, kv heads, keys, head size), any
    strides along rows and keys (a view of a cache with spare columns is read in place), every
    row's keys from column 0; `mask` None or bool broadcastable to (rows, 1, queries, keys), True
    where a query sees a key; `is_causal` (with no mask): query i is key keys - queries + i and sees
    the keys up to it. Returns (rows, heads, queries, head size) in the query's dtype; a query that
    sees no key gets zeros. On the CPU pipeline.kernels.ordered_attention where it is built, else
    :func:`flash_chunked_attention`; elsewhere :func:`matmul_chunked_attention` (their results differ in
    rounding: one device and build, one kernel)."""
    if ordered_attention_runs(query):
        return ordered_attention(query, key, value, mask, scaling=scaling, is_causal=is_causal)
    attend = flash_chunked_attention if query.device.type == "cpu" else matmul_chunked_attention
    return attend(query, key, value, mask, scaling=scaling, is_causal=is_causal, chunk=chunk)


def ordered_attention_runs(query: torch.Tensor) -> bool:
    """Whether :func:`chunked_attention` runs pipeline.kernels.ordered_attention for `query`: on the CPU,
    where that extension is built."""
    return query.device.type == "cpu" and ORDERED.ops() is not None


def keys_moved_to_column_0(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor):
    """A batch whose rows' keys start anywhere (a bool `mask` (rows, 1, queries, keys), each row's
    visible keys one run, left padding) as one whose keys start at column 0: each row's columns
    rotated by its first visible column. Returns (key, value, mask), the inputs where no row moves."""
    first = mask[:, 0].any(dim=1).int().argmax(dim=1)  # (rows,)
    if not bool(first.any()):
        return key, value, mask
    columns = mask.shape[-1]
    source = (torch.arange(columns, device=mask.device)[None, :] + first[:, None]) % columns  # (rows, keys)
    gather = source[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
    moved = mask.gather(3, source[:, None, None, :].expand(-1, mask.shape[1], mask.shape[2], -1))
    return key.gather(2, gather), value.gather(2, gather), moved


def chunked_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                              keys_start_at_column_0: bool = False, **kwargs):
    """:func:`chunked_attention` as a transformers attention function (AttentionInterface):
    `attention_mask` None or a bool mask (what `sdpa_mask` builds, or a caller's 4-d mask).
    A left-padded batch is moved to column 0 first, unless the caller says its keys start there
    (`keys_start_at_column_0`, pipeline.continuous.slots' decode step). Returns ((rows, queries,
    heads, head size), None) like transformers' sdpa_attention_forward."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    causal = attention_mask is None and getattr(module, "is_causal", True)
    # The ordered kernel skips a row's unseen keys wherever they lie: only the chunks need column 0.
    if attention_mask is not None and not keys_start_at_column_0 and not ordered_attention_runs(query):
        key, value, attention_mask = keys_moved_to_column_0(key, value, attention_mask)
    out = chunked_attention(query, key, value, attention_mask, scaling=scale, is_causal=causal)
    return out.transpose(1, 2).contiguous(), None


# A decode step's chunked attention (pipeline/continuous/qwen2_step.py): its masks once a step, its chunks in one call.
_LOWEST, _TINY = torch.finfo(torch.float32).min, torch.finfo(torch.float32).tiny


def chunk_masks(visible, dtype, kv_heads: int):
    """flash_chunked_attention's additive mask for a bool `visible` (rows, 1, 1, whole chunks) of one query a
    row, cut into chunks for :func:`decode_attention`: (rows x kv heads, chunks, 1, CHUNK), each row's repeated
    for its kv heads; and which chunks each row sees nothing of, (rows, 1, chunks, 1, 1), or None where every
    row sees every chunk (filling nothing changes nothing: one row always sees all)."""
    rows, chunks = visible.shape[0], visible.shape[-1] // CHUNK
    by_chunk = visible.view(rows, 1, chunks, 1, CHUNK)
    bias = torch.zeros(by_chunk.shape, dtype=dtype).masked_fill_(~by_chunk, float("-inf"))
    bias = bias.expand(rows, kv_heads, chunks, 1, CHUNK).reshape(rows * kv_heads, chunks, 1, CHUNK)
    unseen = ~by_chunk.any(dim=-1, keepdim=True)
    return bias, unseen if bool(unseen.any()) else None


def decode_attention(q, keys, values, bias, unseen, scaling: float):
    """flash_chunked_attention's result for one query a row, (rows, kv heads, group, head size) in q's dtype,
    over keys and values (rows x kv heads, chunks, CHUNK, head size) masked once a step (:func:`chunk_masks`).

    One flash call for every chunk: the chunks ride as the kernel's heads (q repeated along them by a 0
    stride), and the kernel computes each (batch, head) on its own in the shape one chunk's call has, so each
    chunk's output and log-sum-exp are the bits its own call gives (its blocking follows the query and key
    counts, the same per chunk; batch and head counts only weigh its AMX packing, which needs 64 queries or
    more, torch's FlashAttentionKernel.cpp: a decode step's are the group's). They are merged as
    flash_chunked_attention merges them: weights exp(lse - the row's largest), sums in chunk order in
    float64 (the CPU's cumsum adds in order in a float64 accumulator along any dimension, as sum_in_order
    does)."""
    rows, kv_heads, group, dim = q.shape
    chunks = keys.shape[1]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    queries = q.reshape(rows * kv_heads, 1, group, dim).expand(-1, chunks, -1, -1)
    out, lse = flash(queries, keys, values, attn_mask=bias, scale=scaling)[:2]
    lse = lse.view(rows, kv_heads, chunks, group, 1)
    if unseen is not None:
        lse.masked_fill_(unseen, float("-inf"))
    # Where the merge there fills -inf tops with 0 and zero totals with 1, one clamp each gives the same bits:
    # a -inf top has only -inf beside it (-inf - x is -inf for any finite x), and a total is 0 (every weight 0:
    # its parts are +-0, and +-0 / tiny is +-0 as +-0 / 1) or at least the top chunk's exp(0).
    top = lse.amax(dim=2, keepdim=True).clamp_min_(_LOWEST)
    weights = lse.sub_(top).exp_()
    total = weights.cumsum(2)[:, :, -1].clamp_min_(_TINY)
    parts = out.view(rows, kv_heads, chunks, group, dim)
    parts = parts * weights if q.dtype == torch.float32 else parts.float() * weights
    summed = parts.cumsum(2)[:, :, -1] / total  # a fresh, contiguous result
    return summed if q.dtype == torch.float32 else summed.to(q.dtype)
