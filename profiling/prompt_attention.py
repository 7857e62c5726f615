"""A prompt's attention on the CPU, the two kernels it can take, timed side by side in one run.

A decoder's prompt attends on a CPU through pipeline/kernels/ordered_attention.py where that extension is built
(each query's keys summed first to last: a query's bits do not follow where the engine cut the prompt) and
through torch's SDPA elsewhere (the first chunk causal, a later one with a boolean mask over the keys before it:
transformers' calls). Both are timed on the same inputs, alternated round by round, as the engine prefills a
faithful Qwen2.5-0.5B prompt (24 layers, 14 query heads on 2 kv heads of 64): each --lengths prompt in pieces of
--chunk tokens (GENERATE_PREFILL_CHUNK; 0: whole), every layer its own keys, in each --dtypes (the KV cache's).
Prints ms a prompt (median and best of --rounds) and the ratio, and checks the two agree to rounding; writes
prompt_attention.json into --out (default: a fresh runs/prompt_attention-<UTC time>/). Needs the ordered
attention built (``python -m pipeline.kernels.compiled``).

    python -m profiling.prompt_attention [--lengths 512,1024,1536] [--chunk 512] [--dtypes float32,bfloat16]
"""
from __future__ import annotations

import statistics
import sys
import time

from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.report import run_folder, text_table, write_json

TOOL = "prompt_attention"
HEADS, KV_HEADS, HEAD_SIZE, LAYERS = 14, 2, 64, 24
DTYPES = ("float32", "bfloat16", "float16")


def parser():
    p = make_parser("python -m profiling.prompt_attention", __doc__)
    p.add_argument("--lengths", type=comma_list(int, minimum=2), default=[512, 1024, 1536], help="prompt tokens")
    p.add_argument("--chunk", type=int, default=512, help="tokens a prefill piece (GENERATE_PREFILL_CHUNK); 0: whole")
    p.add_argument("--dtypes", type=comma_list(str), default=["float32", "bfloat16"], help="the cache's dtypes")
    p.add_argument("--layers", type=positive(int), default=LAYERS, help="the model's layers")
    p.add_argument("--rounds", type=positive(int), default=7, help="rounds per kernel (alternated)")
    p.add_argument("--threads", type=positive(int), default=2, help="torch threads")
    add_out(p, TOOL)
    return p


def pieces(length: int, chunk: int) -> list[tuple[int, int]]:
    """The prompt's pieces [start, end): at the multiples of `chunk` (the whole prompt where 0)."""
    cuts = list(range(0, length, chunk or length)) + [length]
    return list(zip(cuts, cuts[1:]))


def kernels(layers_qkv, cuts):
    """{name: the prompt's attention over every layer -> each piece's output of the last layer}."""
    import torch
    import torch.nn.functional as F

    from pipeline.kernels.ordered_attention import ordered_attention
    scale = HEAD_SIZE ** -0.5
    groups = HEADS // KV_HEADS
    masks = {(start, end): (torch.arange(end)[None, :] <= torch.arange(start, end)[:, None])[None, None]
             for start, end in cuts if start}

    def sdpa():
        for q, k, v in layers_qkv:  # transformers' repeat_kv before SDPA, a copy per call
            out = [F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, :e].repeat_interleave(groups, 1),
                                                  v[:, :, :e].repeat_interleave(groups, 1), attn_mask=masks.get((s, e)),
                                                  is_causal=not s, scale=scale) for s, e in cuts]
        return out

    def ordered():
        for q, k, v in layers_qkv:
            out = [ordered_attention(q[:, :, s:e], k[:, :, :e], v[:, :, :e], scaling=scale, is_causal=True)
                   for s, e in cuts]
        return out
    return {"sdpa": sdpa, "ordered": ordered}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import torch

    from pipeline.kernels.ordered_attention import EXTENSION
    unknown = [d for d in args.dtypes if d not in DTYPES]
    if unknown or args.chunk < 0:
        print(f"prompt_attention: --dtypes: unknown {unknown}; {', '.join(DTYPES)}" if unknown
              else "prompt_attention: --chunk: 0 or more", file=sys.stderr)
        return 2
    if EXTENSION.ops() is None:
        print(f"prompt_attention: {EXTENSION.name} is not built: python -m pipeline.kernels.compiled", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    results, table = {}, []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for length in args.lengths:
            g = torch.Generator().manual_seed(length)
            layers_qkv = [tuple(torch.randn(1, heads, length, HEAD_SIZE, generator=g).to(dtype)
                                for heads in (HEADS, KV_HEADS, KV_HEADS)) for _ in range(args.layers)]
            runs = kernels(layers_qkv, pieces(length, args.chunk))
            sdpa_out, ordered_out = (torch.cat(run(), dim=2).float() for run in runs.values())
            drift = (sdpa_out - ordered_out).abs().max().item()
            if not drift <= (1e-4 if dtype == torch.float32 else 3e-2):
                print(f"prompt_attention: the kernels disagree by {drift:.3g} ({dtype_name}, {length})",
                      file=sys.stderr)
                return 1
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.rounds):  # alternated: drift on the machine falls on both alike
                for name, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - start) * 1e3)
            key = f"{dtype_name} {length}"
            results[key] = {name: {"median": round(statistics.median(t), 2), "best": round(min(t), 2)}
                            for name, t in times.items()}
            results[key]["largest_difference"] = drift
            row = [dtype_name, length] + [results[key][n]["median"] for n in runs]
            row += [results[key][n]["best"] for n in runs]
            table.append(row + [results[key]["ordered"]["median"] / results[key]["sdpa"]["median"]])
    header = [("dtype", "<10"), ("tokens", ">7")] + [(f"  {n} median", ">16.2f") for n in ("sdpa", "ordered")]
    header += [(f"  {n} best", ">14.2f") for n in ("sdpa", "ordered")] + [("  ordered / sdpa (median)", ">26.2f")]
    print(f"a prompt's attention, ms a prompt ({args.layers} layers), pieces of {args.chunk or 'the whole prompt'}, "
          f"{args.threads} threads:")
    print(text_table(header, table))
    from profiling.lib.provenance import git_commit
    record = {"args": {k: v for k, v in vars(args).items() if k != "out"}, "commit": git_commit(), "results": results}
    print(f"results in {write_json(run_folder(TOOL, args.out) / f'{TOOL}.json', record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
