"""Decode attention over a left-padded batch: the per-row SDPA loop against one chunked call per layer.

    python -m profiling.bench_chunked_attention [--rows 1,8,16,32] [--widths 330,1000] [--repeat 20] [--threads 2]

Prints the fastest time (the machine is shared: the minimum is the least noisy) of one layer's decode attention and of 24 layers (Qwen2.5-0.5B's depth) per
step, for the generator's per-row SDPA loop (pipeline/kernels/batch_invariance.py) and for the two
forms of pipeline/kernels/chunked_attention.py (flash chunks, the CPU's; matmul chunks), interleaved, plus the largest
difference of the two from float64 attention. Shapes are Qwen2.5-0.5B's: 14 query heads over 2
key/value heads of 64; rows are padded by up to 80 keys, as a running batch is.
"""
from __future__ import annotations

import argparse
import time

import torch

from pipeline.kernels.batch_invariance import _batch_invariant_sdpa
from pipeline.kernels.chunked_attention import flash_chunked_attention, matmul_chunked_attention

HEADS, KV_HEADS, DIM, LAYERS, SCALING = 14, 2, 64, 24, 0.125


class _Layer(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def left_padded(lengths: list[int], dtype: torch.dtype):
    """query, key, value and mask of one decode step over a cache kept as the continuous runner keeps
    it: rows right-aligned, zeros before each row's keys, a view into a buffer with spare columns."""
    g = torch.Generator().manual_seed(0)
    width = max(lengths)
    buffer = torch.randn(2, len(lengths), KV_HEADS, width + 128, DIM, generator=g).to(dtype)
    key, value = buffer[0, :, :, :width], buffer[1, :, :, :width]
    starts = torch.tensor([width - n for n in lengths])
    mask = (torch.arange(width)[None, :] >= starts[:, None])[:, None, None, :]
    key.masked_fill_(~mask[:, :, 0, :, None], 0)
    value.masked_fill_(~mask[:, :, 0, :, None], 0)
    query = (3 * torch.randn(len(lengths), HEADS, 1, DIM, generator=g)).to(dtype)
    return query, key, value, mask


def error(out: torch.Tensor, query, key, value, mask) -> float:
    """Largest absolute difference from float64 attention."""
    q, k, v = (t.double().repeat_interleave(HEADS // t.shape[1], dim=1) for t in (query, key, value))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALING)
    return float((out.double() - want).abs().max())


def measure(rows: int, width: int, dtype: torch.dtype, repeat: int) -> dict[str, tuple[float, float]]:
    lengths = [width - (37 * i) % 80 for i in range(rows)]  # one row unpadded
    query, key, value, mask = left_padded(lengths, dtype)
    layer, row_mask = _Layer(), (mask if rows > 1 else None)
    calls = {"per-row SDPA": lambda: _batch_invariant_sdpa(layer, query, key, value, row_mask, scaling=SCALING,
                                                           dropout=0.0)[0].transpose(1, 2),
             "flash chunks": lambda: flash_chunked_attention(query, key, value, mask, scaling=SCALING),
             "matmul chunks": lambda: matmul_chunked_attention(query, key, value, mask, scaling=SCALING)}
    errors = {name: error(call(), query, key, value, mask) for name, call in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    return {name: (min(values), errors[name]) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiling.bench_chunked_attention", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,8,16,32", help="sequences in the decode batch, comma-separated")
    p.add_argument("--widths", default="330,1000", help="cache widths in keys (the longest row), comma-separated")
    p.add_argument("--repeat", type=int, default=20, help="timed calls per kernel, interleaved")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); fastest of the interleaved calls per layer (us) and x{LAYERS} layers (ms); "
          f"max |error| against float64")
    print(f"{'dtype':>9} {'keys':>5} {'rows':>5} | " + " | ".join(f"{name:>10} us {'x24 ms':>7} {'error':>8}" for name in
                                                              ("per-row", "flash", "matmul")))
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            for width in (int(w) for w in args.widths.split(",")):
                for rows in (int(r) for r in args.rows.split(",")):
                    got = measure(rows, width, dtype, args.repeat)
                    cells = " | ".join(f"{1e6 * s:>10.0f} {1e3 * s * LAYERS:>7.1f} {e:>8.1e}" for s, e in got.values())
                    print(f"{str(dtype)[6:]:>9} {width:>5} {rows:>5} | {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
