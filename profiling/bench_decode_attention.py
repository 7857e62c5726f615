"""Decode attention over a left-padded batch: the per-row SDPA loop against one loop-free pass.

    python -m profiling.bench_decode_attention [--rows 1,8,16] [--widths 330,1000] [--repeat 25]

The generator's attention (pipeline/kernels/batch_invariance.py) gives each row of a left-padded
batch exactly what SDPA gives it alone by calling SDPA once per padded row. :func:`blocked_attention`
is a loop-free alternative for one query per row, bit-identical alone and in any left-padded batch
(`--check` asserts it): every sum over keys runs in an order fixed by the row's own keys. Keys are
grouped in blocks of BLOCK counted back from the newest (the same blocks alone and padded, since
a left-padded cache is right-aligned); each block's probability x value product is one matrix
product of a fixed shape; the softmax sum is summed per block; blocks are added one after another
(cumsum), padding blocks adding exact zeros. The query x key products sum over the head size only.

It is not what the generator runs: (1) it is not faster here (docs/performance.md, "Decode step:
fused int8 and loop-free attention"): the float32 matrix products of a fixed small shape cost
about what the loop saves, and a lone row pays ~20 ops for one SDPA call; (2) a prompt chunk of one
token (a prompt one token past a chunk boundary) is, to the attention, a decode step, while the
same token prefilled in one pass goes through SDPA with its prompt: a lone request and the same
request in the continuous engine would then round differently. Using it needs SDPA's arithmetic
left out of prefill as well, with blocks counted from each row's first key, which a left-padded
cache cannot give without copying it (a cache kept left-aligned could).

The shapes are Qwen2.5-0.5B's: 14 query heads over 2 key/value heads of 64.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pipeline.kernels.batch_invariance import _batch_invariant_sdpa
from profiling.lib.cli import comma_list, make_parser, positive

HEADS, KV_HEADS, DIM = 14, 2, 64
BLOCK = 128  # keys per block: a multiple of 32, whole vectors for the elementwise kernels


def blocked_attention(query, key, value, attention_mask, scaling: float):
    """One query per row over a right-aligned cache, in one pass over the batch (float32 inside).

    query (rows, heads, 1, dim); key and value (rows, kv_heads, keys, dim), the newest key last in
    every row; attention_mask None or bool (rows, 1, 1, keys), False for padding.
    Returns (rows, 1, heads, dim) in the query's dtype."""
    rows, heads, _, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads
    head_keys = width % BLOCK  # keys in the oldest, partial block; it is padded on the left
    blocks = -(-width // BLOCK)
    key, value = key.float(), value.float()
    q = query.float().reshape(rows, kv_heads, group, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).mul_(scaling)  # (rows, kv_heads, group, keys)
    if attention_mask is not None:
        scores.masked_fill_(~attention_mask, float("-inf"))
    if head_keys:
        scores = torch.nn.functional.pad(scores, (BLOCK - head_keys, 0), value=float("-inf"))
    weights = scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_().view(rows, kv_heads, group, blocks, BLOCK)
    total = weights.sum(dim=-1).cumsum(dim=-1)[..., -1:]  # (rows, kv_heads, group, 1)
    weights = weights.transpose(2, 3)  # (rows, kv_heads, blocks, group, BLOCK)
    parts = []
    if head_keys:
        oldest = torch.nn.functional.pad(value[:, :, :head_keys], (0, 0, BLOCK - head_keys, 0))
        parts.append(torch.matmul(weights[:, :, :1], oldest.unsqueeze(2)))
    if blocks > (1 if head_keys else 0):
        full = value[:, :, head_keys:].unflatten(2, (-1, BLOCK))
        parts.append(torch.matmul(weights[:, :, 1 if head_keys else 0:], full))
    per_block = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # (rows, kv_heads, blocks, group, dim)
    out = per_block.cumsum(dim=2)[:, :, -1].div_(total)
    return out.reshape(rows, 1, heads, dim).to(query.dtype)


def left_padded(lengths, dtype, seed: int = 0, room: int = 5):
    """query, key, value, mask and row starts of a cache as the continuous runner keeps it: rows
    right-aligned, zeros before each row's keys, a view into a wider buffer."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    buffer = torch.randn(2, len(lengths), KV_HEADS, width + room, DIM, generator=g).to(dtype)
    key, value = buffer[0, :, :, :width], buffer[1, :, :, :width]
    starts = [width - n for n in lengths]
    for row, start in enumerate(starts):
        key[row, :, :start] = 0
        value[row, :, :start] = 0
    mask = (torch.arange(width)[None, :] >= torch.tensor(starts)[:, None])[:, None, None, :]
    query = (3 * torch.randn(len(lengths), HEADS, 1, DIM, generator=g)).to(dtype)
    return query, key, value, mask, starts


def check(dtype, lengths) -> None:
    """Raise AssertionError where a row's blocked attention differs alone and in the batch."""
    query, key, value, mask, starts = left_padded(lengths, dtype)
    batch = blocked_attention(query, key, value, mask, 0.125)
    for row, start in enumerate(starts):
        alone = blocked_attention(query[row:row + 1], key[row:row + 1, :, start:], value[row:row + 1, :, start:],
                                  None, 0.125)
        assert torch.equal(alone[0], batch[row]), f"row {row} ({lengths[row]} keys) differs alone, {dtype}"


class _Layer(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def time_both(rows: int, width: int, dtype, repeat: int) -> dict[str, float]:
    """Median microseconds of one layer's decode attention, the two interleaved."""
    lengths = [width - (37 * i) % 80 for i in range(rows)]  # padding of up to 80 keys, one row unpadded
    query, key, value, mask, _ = left_padded(lengths, dtype)
    layer, row_mask = _Layer(), (mask if rows > 1 else None)
    calls = {"per-row SDPA": lambda: _batch_invariant_sdpa(layer, query, key, value, row_mask, scaling=0.125, dropout=0.0),
             "blocked": lambda: blocked_attention(query, key, value, mask, 0.125)}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(repeat):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    return {name: 1e6 * statistics.median(values) for name, values in samples.items()}


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_decode_attention", __doc__.split("\n\n")[0])
    p.add_argument("--rows", type=comma_list(int, minimum=1, what="row counts"), default=[1, 8, 16],
                   help="sequences in the decode batch")
    p.add_argument("--widths", type=comma_list(int, minimum=1, what="widths"), default=[330, 1000],
                   help="cache widths in keys (the longest row)")
    p.add_argument("--repeat", type=positive(int), default=25, help="timed calls per kernel, interleaved")
    p.add_argument("--threads", type=positive(int), default=1, help="torch threads")
    p.add_argument("--check", action="store_true", help="also assert each row is bit-identical alone and batched")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); median us per layer")
    print(f"{'dtype':>9} {'keys':>5} {'rows':>5} {'per-row SDPA':>13} {'blocked':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        if args.check:
            check(dtype, [1, 37, BLOCK, BLOCK + 1, 300, 777, 777, 1500])
        for width in args.widths:
            for rows in args.rows:
                us = time_both(rows, width, dtype, args.repeat)
                print(f"{str(dtype)[6:]:>9} {width:>5} {rows:>5} {us['per-row SDPA']:>13.0f} {us['blocked']:>9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
