"""The ordered attention kernel alone at a decode step's shapes, this checkout's against another commit's.

pipeline/kernels/ordered_attention.py's op at one query a row over Qwen2.5-0.5B's heads (14 query heads, 2 kv
heads, head size 64), each row's own length (--length, the last rows a few keys shorter), in each --dtypes (the
KV cache's: float32 in the quantized variants, bfloat16 by default on a CPU with bf16 instructions), at each
--rows, on torch's --threads. A call reads one of --layers caches in turn, as a decode step's layers do (between
them the step reads the weights: each layer's keys and values come from memory, not from the core's caches).

--compare REV builds REV's kernel source (git archive into a temporary folder; its own extension name, so
both load in this process) and times the two alternately, round by round, on the same inputs, after
checking that they give the same bits. Prints µs per call (median and best of --rounds) and the ratio, and
writes attention_kernel.json into --out (default: a fresh runs/attention_kernel-<UTC time>/).

    python -m profiling.attention_kernel --compare HEAD~1 [--rows 1,8] [--dtypes float32,bfloat16]
"""
from __future__ import annotations

import contextlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.report import run_folder, text_table
from profiling.lib.revisions import checkout, write_compared

TOOL = "attention_kernel"
HEADS, KV_HEADS, HEAD_SIZE = 14, 2, 64


def parser():
    p = make_parser("python -m profiling.attention_kernel", __doc__)
    p.add_argument("--rows", type=comma_list(int, minimum=1), default=[1, 8], help="rows (sequences) a call")
    p.add_argument("--dtypes", type=comma_list(str), default=["float32", "bfloat16"], help="the cache's dtypes")
    p.add_argument("--length", type=positive(int), default=256, help="the longest row's keys")
    p.add_argument("--layers", type=positive(int), default=24, help="caches read in turn (a model's layers)")
    p.add_argument("--calls", type=positive(int), default=48, help="calls timed per round")
    p.add_argument("--rounds", type=positive(int), default=15, help="rounds per kernel (alternated)")
    p.add_argument("--threads", type=positive(int), default=2, help="torch threads")
    p.add_argument("--compare", default="", metavar="REV", help="a commit whose kernel is timed beside this one's")
    add_out(p, TOOL)
    return p


def kernel_of(tree: Path):
    """The ordered_attention op built from `tree`'s source (built here if it is not yet)."""
    path = tree / "pipeline" / "kernels" / "ordered_attention.py"
    spec = importlib.util.spec_from_file_location(f"ordered_attention_{abs(hash(str(tree)))}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"no kernel source at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.EXTENSION.build()
    op = module.EXTENSION.registered("ordered_attention")
    if op is None:
        raise RuntimeError(f"{module.EXTENSION.name} did not load on this CPU")
    return op


def inputs(rows: int, dtype, length: int, layers: int):
    import torch
    g = torch.Generator().manual_seed(0)
    query = torch.randn(rows, HEADS, 1, HEAD_SIZE, generator=g).to(dtype)
    capacity = length + 64
    caches = [(torch.randn(rows, KV_HEADS, capacity, HEAD_SIZE, generator=g).to(dtype),
               torch.randn(rows, KV_HEADS, capacity, HEAD_SIZE, generator=g).to(dtype)) for _ in range(layers)]
    lengths = (length - 3 * torch.arange(rows)).clamp(min=1)
    return query, caches, lengths


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import torch
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    unknown = [d for d in args.dtypes if d not in dtypes]
    if unknown:
        print(f"attention_kernel: --dtypes: unknown {unknown}; {', '.join(dtypes)}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    out = run_folder(TOOL, args.out)
    with contextlib.ExitStack() as stack:
        kernels = {"here": kernel_of(Path(__file__).resolve().parents[1])}
        if args.compare:
            kernels[args.compare] = kernel_of(stack.enter_context(checkout(args.compare)))
        results: dict[str, dict] = {label: {} for label in kernels}
        table = []
        for dtype_name in args.dtypes:
            for rows in args.rows:
                query, caches, lengths = inputs(rows, dtypes[dtype_name], args.length, args.layers)
                first = {label: op(query, *caches[0], None, lengths, True, HEAD_SIZE ** -0.5)
                         for label, op in kernels.items()}
                bits = [o.view(torch.int32 if o.dtype == torch.float32 else torch.int16) for o in first.values()]
                if any(not torch.equal(bits[0], b) for b in bits[1:]):
                    print(f"attention_kernel: the kernels give other bits ({dtype_name}, {rows} rows)", file=sys.stderr)
                    return 1
                times: dict[str, list[float]] = {label: [] for label in kernels}
                for _ in range(args.rounds):  # alternated: drift on the machine falls on both alike
                    for label, op in kernels.items():
                        start = time.perf_counter()
                        for call in range(args.calls):
                            op(query, *caches[call % args.layers], None, lengths, True, HEAD_SIZE ** -0.5)
                        times[label].append((time.perf_counter() - start) / args.calls * 1e6)
                key = f"{dtype_name} {rows}"
                for label in kernels:
                    results[label][key] = {"median_us": round(statistics.median(times[label]), 1),
                                           "best_us": round(min(times[label]), 1)}
                row = [dtype_name, rows] + [results[label][key]["median_us"] for label in kernels]
                row += [results[label][key]["best_us"] for label in kernels]
                if args.compare:
                    row.append(round(results["here"][key]["median_us"] / results[args.compare][key]["median_us"], 2))
                table.append(row)
    labels = list(kernels)
    header = ([("dtype", "<10"), ("rows", ">5")] + [(f"  {label} median us", ">22.1f") for label in labels]
              + [(f"  {label} best us", ">20.1f") for label in labels]
              + ([("  here / compared (median)", ">27.2f")] if args.compare else []))
    print(f"ordered attention, one query a row, {HEADS} heads / {KV_HEADS} kv heads x {HEAD_SIZE}, "
          f"{args.length} keys, {args.threads} threads, {args.layers} caches in turn:")
    print(text_table(header, table))
    print(f"results in {write_compared(out, TOOL, args, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
