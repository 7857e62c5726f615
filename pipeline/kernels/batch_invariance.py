"""A row's result independent of its batch-mates: bfloat16 Linears and SDPA attention over padded batches.

* :class:`RowInvariantLinear` (via :func:`make_bf16_linears_row_invariant`): a lone bfloat16 row
  runs as a batch of two, the way every batch runs.
* :func:`use_batch_invariant_attention`: a transformers decoder attends each left-padded row
  over its own keys, as it would alone.
"""
from __future__ import annotations

import torch

from pipeline.kernels.versions import check_kernel_versions

# The name under which the attention is registered with transformers.
BATCH_INVARIANT_ATTENTION = "batch_invariant_sdpa"


class RowInvariantLinear(torch.nn.Linear):
    """A bfloat16 Linear whose result for a row does not depend on how many rows come with it.

    oneDNN's bf16 CPU matmul takes one kernel for a single row and another for two or more, and
    they sum a long row (in_features of ~2000 and up: Qwen's 4864-wide down_proj) in a different
    order, so one decode step alone and the same step in a batch round differently. A lone row
    is run as two, the way every batch runs."""

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] != 1:
            return super().forward(x)
        out = torch.nn.functional.linear(rows.expand(2, -1).contiguous(), self.weight, self.bias)[:1]
        return out.reshape(*x.shape[:-1], self.out_features)


def make_bf16_linears_row_invariant(model) -> int:
    """Swap the class of every bfloat16 nn.Linear (no weight is copied); returns how many."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16]
    for linear in linears:
        linear.__class__ = RowInvariantLinear
    return len(linears)


def _row_key_starts(attention_mask) -> list[int] | None:
    """The first key each row may see, or None where some row's visible keys are not one
    unbroken run to the end (padding in the middle: not a left-padded batch)."""
    visible = attention_mask[:, 0].any(dim=1)  # (rows, keys): seen by any of the row's queries
    starts = visible.int().argmax(dim=1)
    tail = torch.arange(visible.shape[1], device=visible.device)[None, :] >= starts[:, None]
    return starts.tolist() if torch.equal(visible, tail) else None


def _batch_invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, run for each row of a left-padded batch over its own keys.

    SDPA's CPU kernel sums keys in blocks counted from the first column, so left padding moves a
    row's block boundaries and its attention rounds differently from the row alone (visibly in
    bfloat16). Each padded row is sliced to its real keys and queries and given exactly what it
    would be given alone (transformers passes no mask where a row has no padding and its queries
    are 1 or all of its keys); a batch without padding is one call."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    starts = None if attention_mask is None or attention_mask.dtype != torch.bool else _row_key_starts(attention_mask)
    if starts is None or not any(starts):
        return sdpa_attention_forward(module, query, key, value, attention_mask=attention_mask, **kwargs)
    q_len, kv_len = query.shape[2], key.shape[2]
    past = kv_len - q_len  # query i is key past + i
    output = query.new_zeros((query.shape[0], q_len, query.shape[1], value.shape[3]))
    for row, start in enumerate(starts):
        q0 = max(0, start - past)  # queries before it are padding: they keep zeros, nobody reads them
        mask = attention_mask[row:row + 1, :, q0:, start:]
        if q_len - q0 == 1 or q_len - q0 == kv_len - start:
            mask = None  # as transformers does for an unpadded row: SDPA then runs is_causal over a whole prompt
        out, _ = sdpa_attention_forward(module, query[row:row + 1, :, q0:], key[row:row + 1, :, start:],
                                        value[row:row + 1, :, start:], attention_mask=mask, **kwargs)
        output[row, q0:] = out[0]
    return output, None


def use_batch_invariant_attention(model) -> None:
    """Make `model` (a transformers decoder) attend with :func:`_batch_invariant_sdpa`.

    Raises ConfigError where torch or transformers is outside the versions this was verified against."""
    check_kernel_versions()
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(BATCH_INVARIANT_ATTENTION, _batch_invariant_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(BATCH_INVARIANT_ATTENTION, sdpa_mask)  # the masks SDPA gets
    model.set_attn_implementation(BATCH_INVARIANT_ATTENTION)
