"""A decode step's kernel alone at the step's shapes, this checkout's source against another commit's.

--kernel names the kernel, measured as a faithful Qwen2.5-0.5B decode step calls it (24 layers; hidden 896,
14 query heads and 2 kv heads of 64, MLP 4,864, vocabulary 151,936), at each --rows (sequences decoding):

* ``attention`` (pipeline/kernels/ordered_attention.py): one query a row over each row's own keys (--length,
  the later rows a few shorter), in each --dtypes (the KV cache's: float32 in the quantized variants,
  bfloat16 by default on a CPU with bf16 instructions); a call reads one layer's cache, the next call the
  next layer's, as a step does (between them it reads the weights: a layer's keys come from memory);
* ``int8-dynamic`` (pipeline/kernels/vnni_int8.py) and ``int4-dynamic`` (pipeline/kernels/vnni_int4.py):
  every product of a step (each layer's q/k/v, o, gate/up and down, then the output layer) on random weights
  packed by that commit's own `pack`, one after the other: every weight comes from memory, as in a step.

--compare REV builds REV's source of the kernel (git archive into a temporary folder; its own extension
name, so both load in this process) and times the two alternately, round by round, on the same inputs,
after checking that they give the same bits. Prints µs per call (attention) or ms per step's products, the
median and best of --rounds, and the ratio; writes kernel_compare.json into --out (default: a fresh
runs/kernel_compare-<UTC time>/). Needs g++ and the CPU flags the kernel needs (AVX2; AVX-512 VNNI for the
quantized products).

    python -m profiling.kernel_compare --kernel attention --compare HEAD~1 [--rows 1,8] [--dtypes float32,bfloat16]
    python -m profiling.kernel_compare --kernel int8-dynamic --compare HEAD~1 --rows 1,4,8
"""
from __future__ import annotations

import contextlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.report import run_folder, text_table
from profiling.lib.revisions import checkout, write_compared

TOOL = "kernel_compare"
HIDDEN, HEADS, KV_HEADS, HEAD_SIZE, MLP, VOCABULARY, LAYERS = 896, 14, 2, 64, 4864, 151936, 24
# A layer's products, (inputs, outputs): q/k/v fused, o, gate/up fused, down.
LAYER_PRODUCTS = ((HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_SIZE), (HIDDEN, HIDDEN), (HIDDEN, 2 * MLP), (MLP, HIDDEN))
KERNELS = {"attention": "ordered_attention", "int8-dynamic": "vnni_int8", "int4-dynamic": "vnni_int4"}


def parser():
    p = make_parser("python -m profiling.kernel_compare", __doc__)
    p.add_argument("--kernel", choices=sorted(KERNELS), default="attention", help="the kernel measured")
    p.add_argument("--rows", type=comma_list(int, minimum=1), default=[1, 8], help="rows (sequences) a call")
    p.add_argument("--dtypes", type=comma_list(str), default=["float32", "bfloat16"],
                   help="attention: the cache's dtypes")
    p.add_argument("--length", type=positive(int), default=256, help="attention: the longest row's keys")
    p.add_argument("--layers", type=positive(int), default=LAYERS, help="the model's layers")
    p.add_argument("--calls", type=positive(int), default=48, help="attention: calls timed per round")
    p.add_argument("--rounds", type=positive(int), default=15, help="rounds per commit (alternated)")
    p.add_argument("--threads", type=positive(int), default=2, help="torch threads")
    p.add_argument("--compare", default="", metavar="REV", help="a commit whose kernel is timed beside this one's")
    add_out(p, TOOL)
    return p


def kernel_module(tree: Path, kernel: str):
    """`tree`'s pipeline/kernels module of `kernel`, its extension built here if it is not yet."""
    path = tree / "pipeline" / "kernels" / f"{KERNELS[kernel]}.py"
    spec = importlib.util.spec_from_file_location(f"{KERNELS[kernel]}_{abs(hash(str(tree)))}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"no kernel source at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.EXTENSION.build()
    if module.EXTENSION.ops() is None:
        raise RuntimeError(f"{module.EXTENSION.name} did not load on this CPU")
    return module


def attention_case(module, rows: int, dtype, args) -> tuple[Callable[[int], Any], int]:
    """(one call, given its index -> its output; calls a round) for the attention at `rows` rows."""
    import torch
    op = module.EXTENSION.registered("ordered_attention")
    g = torch.Generator().manual_seed(0)
    query = torch.randn(rows, HEADS, 1, HEAD_SIZE, generator=g).to(dtype)
    capacity = args.length + 64
    caches = [tuple(torch.randn(rows, KV_HEADS, capacity, HEAD_SIZE, generator=g).to(dtype) for _ in range(2))
              for _ in range(args.layers)]
    lengths = (args.length - 3 * torch.arange(rows)).clamp(min=1)
    return (lambda call: op(query, *caches[call % args.layers], None, lengths, True, HEAD_SIZE ** -0.5)), args.calls


def product_shapes(layers: int) -> list[tuple[int, int]]:
    return [shape for _ in range(layers) for shape in LAYER_PRODUCTS] + [(HIDDEN, VOCABULARY)]


def products_case(module, kernel: str, rows: int, args) -> tuple[Callable[[int], Any], int]:
    """(a step's products, one after the other -> the first one's output; 1 call a round) at `rows` rows,
    on weights drawn from one seed (the same for every commit) and packed by `module`'s own pack."""
    import torch

    from pipeline.kernels.int4 import group_width
    g = torch.Generator().manual_seed(0)
    calls = []
    for k, n in product_shapes(args.layers):
        x = torch.randn(rows, k, generator=g)
        scale = (torch.rand(n, generator=g) / 100).to(torch.bfloat16).float()
        if kernel == "int8-dynamic":
            packed, offsets = module.pack(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8))
            calls.append((module.EXTENSION.registered("vnni_linear"), (x, packed, offsets, scale, None)))
        else:
            groups = k // group_width(k)  # int4-dynamic's groups, as Int4DynamicLinear cuts them
            codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
            group_scale = (torch.rand(n, groups, generator=g) / 50).to(torch.bfloat16).float()
            offset = (torch.randn(n, groups, generator=g) / 100).to(torch.bfloat16).float()
            packed, params = module.pack(codes, group_scale, offset)
            calls.append((module.EXTENSION.registered("vnni_int4_linear"), (x, packed, params, n, None)))

    def step(_call: int):
        outputs = [op(*arguments) for op, arguments in calls]
        return outputs[0]
    return step, 1


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import torch
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    unknown = [d for d in args.dtypes if d not in dtypes]
    if unknown:
        print(f"kernel_compare: --dtypes: unknown {unknown}; {', '.join(dtypes)}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    attention = args.kernel == "attention"
    cases = [(d, rows) for d in args.dtypes for rows in args.rows] if attention else [("", rows) for rows in args.rows]
    unit, scale_to_unit = ("us a call", 1e6) if attention else ("ms a step", 1e3)
    out = run_folder(TOOL, args.out)
    with contextlib.ExitStack() as stack:
        modules = {"here": kernel_module(Path(__file__).resolve().parents[1], args.kernel)}
        if args.compare:
            modules[args.compare] = kernel_module(stack.enter_context(checkout(args.compare)), args.kernel)
        results: dict[str, dict] = {label: {} for label in modules}
        table = []
        for dtype_name, rows in cases:
            runs = {label: (attention_case(module, rows, dtypes[dtype_name], args) if attention
                            else products_case(module, args.kernel, rows, args)) for label, module in modules.items()}
            firsts = [run(0) for run, _ in runs.values()]
            if any(not torch.equal(firsts[0], other) for other in firsts[1:]):
                print(f"kernel_compare: the commits' kernels give other results ({dtype_name or args.kernel}, "
                      f"{rows} rows)", file=sys.stderr)
                return 1
            times: dict[str, list[float]] = {label: [] for label in runs}
            for _ in range(args.rounds):  # alternated: drift on the machine falls on both alike
                for label, (run, calls) in runs.items():
                    start = time.perf_counter()
                    for call in range(calls):
                        run(call)
                    times[label].append((time.perf_counter() - start) / calls * scale_to_unit)
            key = f"{dtype_name} {rows}" if attention else str(rows)
            for label in runs:
                results[label][key] = {"median": round(statistics.median(times[label]), 2),
                                       "best": round(min(times[label]), 2)}
            row = ([dtype_name] if attention else []) + [rows]
            row += [results[label][key]["median"] for label in runs] + [results[label][key]["best"] for label in runs]
            if args.compare:
                row.append(results["here"][key]["median"] / results[args.compare][key]["median"])
            table.append(row)
            del runs
    labels = list(modules)
    header = ([("dtype", "<10")] if attention else []) + [("rows", ">5")]
    header += [(f"  {label} median", ">18.2f") for label in labels] + [(f"  {label} best", ">16.2f") for label in labels]
    header += [("  here / compared (median)", ">27.2f")] if args.compare else []
    print(f"{args.kernel}, {unit}, {args.threads} threads, {args.layers} layers"
          + (f", {args.length} keys:" if attention else ":"))
    print(text_table(header, table))
    print(f"results in {write_compared(out, TOOL, args, {'unit': unit, **results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
