"""What row-invariance costs per oneDNN instruction set: the service's float Linears (rows as they come,
pipeline.kernels.batch_invariance) against the alternative design, every call in tiles of one row
count, and whether each keeps a row's bits alone and among others.

    python -m profiling.bench_row_invariance [--isas AVX2,AVX512_CORE_BF16,AVX512_CORE_AMX] [--tile 64]
                                             [--repeat 5] [--out DIR]

Each level runs in a process of its own held to it (ONEDNN_MAX_CPU_ISA; default: the checked levels
this CPU has, and AVX512_CORE_AMX where it has AMX), in bfloat16 where the level has avx512_bf16, else
float32. Workloads: bert-base's Linears (12 layers) at 300 and 3,000 rows (an encoder batch's tokens),
Qwen2.5-0.5B's Linears and output layer (24 layers) at 1, 8 and 16 rows (decode steps) and 512 (a
prefill chunk); random weights, packed as the service packs them. Invariance: Qwen's up projection, rows
alone against the same rows among 2 to 600. The median of --repeat runs after one warm-up; one process
at a time, so the levels are measured side by side in one run. Writes bench_row_invariance.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BERT_BASE = [(768, 768)] * 4 + [(768, 3072), (3072, 768)]
QWEN_05B = [(896, 896), (896, 128), (896, 128), (896, 896), (896, 4864), (896, 4864), (4864, 896)]
QWEN_VOCAB = 151936
WORKLOADS = {"encoder 300 rows": ("bert", 300), "encoder 3000 rows": ("bert", 3000),
             "decode 1 row": ("qwen", 1), "decode 8 rows": ("qwen", 8), "decode 16 rows": ("qwen", 16),
             "prefill 512 rows": ("qwen", 512)}


def tiled(linear, x, tile: int):
    """`linear` (a RowInvariantLinear on the CPU) with every oneDNN call of exactly `tile` rows: its own
    forward, one call per tile."""
    import torch
    n = x.shape[0]
    padded = torch.nn.functional.pad(x, (0, 0, 0, -n % tile))
    outs = [linear(part) for part in padded.split(tile)]
    return (outs[0] if len(outs) == 1 else torch.cat(outs))[:n]


def _median_ms(linears, inputs, run, repeat: int) -> float:
    """The median time (ms) of `run` over every Linear, after one warm-up."""
    def once():
        for linear in linears:
            run(linear, inputs[linear.in_features])
    once()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        once()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def child(tile: int, repeat: int) -> dict:
    import torch

    from pipeline.cpu_features import cpu_supports_bf16
    from pipeline.kernels.batch_invariance import make_linears_row_invariant
    dtype = torch.bfloat16 if cpu_supports_bf16() else torch.float32
    torch.manual_seed(0)

    def layers(shapes, count):
        model = torch.nn.Sequential(*[torch.nn.Linear(k, n).to(dtype) for _ in range(count) for k, n in shapes])
        make_linears_row_invariant(model)
        return list(model)

    models = {"bert": layers(BERT_BASE, 12), "qwen": layers(QWEN_05B, 24) + layers([(896, QWEN_VOCAB)], 1)}
    designs = {"as they come": lambda linear, x: linear(x), f"tiles of {tile}": lambda linear, x: tiled(linear, x, tile)}
    timings: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for name, (model, rows) in WORKLOADS.items():
            inputs = {k: torch.randn(rows, k).to(dtype) for k in {lin.in_features for lin in models[model]}}
            timings[name] = {}
            for design, run in designs.items():
                timings[name][design] = _median_ms(models[model], inputs, run, repeat)
        up = models["qwen"][4]
        x = torch.randn(600, 896, generator=torch.Generator().manual_seed(1)).to(dtype)
        invariant = {}
        for design, run in designs.items():
            alone = torch.cat([run(up, x[i:i + 1]) for i in range(20)])
            invariant[design] = all(torch.equal(run(up, x[:rows])[:20], alone[:rows])
                                    for rows in (2, 3, 8, 17, 64, 600))
    return {"dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(), "ms": timings,
            "invariant": invariant}


def levels_here() -> list[str]:
    from pipeline.cpu_features import AMX_CPU_FLAGS, cpu_flags, onednn_isas_here
    return onednn_isas_here() + (["AVX512_CORE_AMX"] if AMX_CPU_FLAGS <= cpu_flags() else [])


def table(found: dict[str, dict], tile: int) -> str:
    lines = [f"| level | dtype | workload | as they come (ms) | tiles of {tile} (ms) | tiles / as they come |",
             "|---|---|---|---|---|---|"]
    for level, r in found.items():
        for name, ms in r["ms"].items():
            plain, tiles = ms["as they come"], ms[f"tiles of {tile}"]
            lines.append(f"| {level} | {r['dtype']} | {name} | {plain:.1f} | {tiles:.1f} | {tiles / plain:.2f}x |")
        lines.append(f"| {level} | {r['dtype']} | a row's bits alone = among 2-600 | "
                     + " | ".join("yes" if ok else "NO" for ok in r["invariant"].values()) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiling.bench_row_invariance", description=__doc__.split("\n\n")[0])
    p.add_argument("--isas", default=None, help="oneDNN levels, comma-separated (default: those this CPU has)")
    p.add_argument("--tile", type=int, default=64, help="rows per call of the tiled design")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "runs" / time.strftime("row_invariance-%Y%m%dT%H%M%SZ", time.gmtime())))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.tile, args.repeat)))
        return 0
    found = {}
    for level in args.isas.split(",") if args.isas else levels_here():
        env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
        done = subprocess.run([sys.executable, "-m", "profiling.bench_row_invariance", "--child", "--tile",
                               str(args.tile), "--repeat", str(args.repeat)], cwd=ROOT, capture_output=True,
                              text=True, env={**env, "ONEDNN_MAX_CPU_ISA": level})
        if done.returncode:
            print(f"[bench_row_invariance] {level}: exited {done.returncode}\n{done.stderr[-2000:]}", flush=True)
            return 1
        found[level] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"[bench_row_invariance] {level}: done", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_row_invariance.json").write_text(json.dumps(found, indent=1) + "\n")
    print(table(found, args.tile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
