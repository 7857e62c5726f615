"""Attention on CUDA that gives a row the same bits whatever else its call holds: always a boolean mask, which SDPA
without cuDNN (pipeline.kernels.batch_invariance.attend_without_cudnn) runs as memory-efficient attention. That
kernel sums each query's keys in blocks counted from column 0 and masked keys add exact zeros, so neither the other
rows of a batch nor where a prompt was cut into chunks moves a query's sums. FlashAttention (a mask-less call) splits
a row's keys by how many rows and heads share the call, and rounds a prompt's later chunk otherwise than the whole
prompt; cuDNN's kernel differed in float16 where chunks were cut mid-block (probed on an H200: docs/performance.md,
section 32)."""
from __future__ import annotations

import torch


def bidirectional(query, key, value, runs, attention_mask, scale):
    """An encoder's attention, as (rows, queries, heads, dim): the batch in one call, masked to each row's keys (a row
    alone: every key visible), so a right-padded row gets its bits alone; a row padded on the left is moved to
    column 0 first. `runs`: each row's keys [start, end); queries past them are padding, and nothing reads them."""
    if any(start for start, _ in runs):
        out = query.new_zeros((query.shape[0], query.shape[2], query.shape[1], value.shape[3]))
        for row, (start, end) in enumerate(runs):
            out[row, start:end] = bidirectional(query[row:row + 1, :, start:end], key[row:row + 1, :, start:end],
                                                value[row:row + 1, :, start:end], [(0, end - start)], None, scale)[0]
        return out
    rows, keys = query.shape[0], key.shape[2]
    visible = torch.ones((1, 1, 1, keys), dtype=torch.bool, device=query.device) if attention_mask is None \
        else attention_mask[:, :1, :1, :]  # an encoder's mask is its rows' key padding, the same for every query
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=visible.expand(rows, 1, query.shape[2], keys), scale=scale)
    return out.transpose(1, 2)


def causal(query, key, value, scale):
    """One row's causal attention of queries that are its last keys (a whole prompt, or a later chunk after the keys
    before it), as (1, queries, heads, dim), the key heads repeated: a query's bits do not follow whether the prompt
    was cut into chunks (the engine's, at the multiples of GENERATE_PREFILL_CHUNK) or not (the reference's)."""
    from transformers.integrations.sdpa_attention import repeat_kv
    queries, keys = query.shape[2], key.shape[2]
    mask = (torch.arange(keys, device=query.device)[None, :]
            <= torch.arange(keys - queries, keys, device=query.device)[:, None])[None, None]
    groups = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, groups), repeat_kv(value, groups),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(1, 2)
