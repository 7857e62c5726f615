"""One int8 Linear, several ways, side by side: int8-dynamic's kernels against fbgemm's.

`int8-dynamic` (pipeline/kernels/int8.py) quantizes each row with its own scale so a row's result
cannot depend on its batch-mates. It multiplies either with `torch._int_mm` (CUDA, and CPUs
where fbgemm is not exact) or by feeding those per-row codes to fbgemm's dynamic linear with
one anchor row (-128 ... 127) that pins fbgemm's activation scale to exactly 1, which gives
`_int_mm`'s bits (pipeline.kernels.fbgemm.AnchoredFbgemm). `torch.ao`'s `quantize_dynamic` (fbgemm
with one scale for the whole tensor: not batch-invariant) is the speed it is measured against. Each shape is timed at each row count, the four
interleaved, medians printed; `--check` also asserts the anchored sums equal `_int_mm`'s and that
each row's output is the same alone and in the batch. Where pipeline/kernels/fused_int8.py's
extension is built (`python -m pipeline.kernels.fused_int8`), a fifth column runs the anchored
path with its per-row glue fused, and `--check` asserts its bits too. On a CPU with AMX int8 two
more columns run oneDNN's packed int8 product (pipeline.kernels.onednn_int8; what int8-dynamic runs
there), with the glue as torch ops and fused.

    python -m profiling.bench_int8_linear --rows 1,16,256 --repeat 20
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from pipeline.kernels.fused_int8 import fused_ops
from pipeline.kernels.int8 import Int8DynamicLinear
from pipeline.kernels.onednn_int8 import onednn_int8_is_used
from profiling.lib.cli import comma_list, make_parser, positive

# The Qwen2.5-0.5B Linears that dominate a decode step: q/o, k/v, MLP up/gate, MLP down, the output head.
SHAPES = ((896, 896), (896, 128), (896, 4864), (4864, 896), (896, 151936))
# int8-dynamic's anchored fbgemm path with its per-row glue as torch ops, and fused (pipeline/kernels/fused_int8.py).
ANCHORED, FUSED = "fbgemm per row (torch ops)", "fbgemm per row (fused)"
ONEDNN, ONEDNN_FUSED = "onednn per row (torch ops)", "onednn per row (fused)"


def variants(in_features: int, out_features: int) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's quantized modules are deprecated, still shipped
        per_tensor = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                            dtype=torch.qint8)
    models = {"float32": linear, "_int_mm per row": Int8DynamicLinear(linear, kernel="int_mm"),
              "fbgemm per tensor": per_tensor, ANCHORED: Int8DynamicLinear(linear, kernel="fbgemm", fused=False)}
    if fused_ops() is not None:
        models[FUSED] = Int8DynamicLinear(linear, kernel="fbgemm")
    if onednn_int8_is_used():
        models[ONEDNN] = Int8DynamicLinear(linear, kernel="onednn", fused=False)
        if fused_ops() is not None:
            models[ONEDNN_FUSED] = Int8DynamicLinear(linear, kernel="onednn")
    return models


def check(models: dict[str, torch.nn.Module], rows: int) -> None:
    """The anchored fbgemm path (and its fused glue) gives _int_mm's bits, and each row's output is the same alone."""
    int_mm, anchored = models["_int_mm per row"], models[ANCHORED]
    assert anchored._fbgemm is not None, "fbgemm is not exact on this CPU: int8-dynamic uses _int_mm here"
    x = torch.randn(rows, int_mm.in_features) * torch.logspace(-2, 2, rows)[:, None]
    assert torch.equal(anchored(x), int_mm(x)), "anchored fbgemm and _int_mm differ"
    for name in (FUSED, ONEDNN, ONEDNN_FUSED):
        if name in models:
            assert torch.equal(models[name](x), anchored(x)), f"{name} and the anchored fbgemm path differ"
    together = anchored(x)
    alone = torch.cat([anchored(x[i:i + 1]) for i in range(rows)])
    assert torch.equal(alone, together), "anchored output depends on the batch"


def time_interleaved(models: dict[str, torch.nn.Module], x, repeat: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        model(x)  # first call: packing and allocator warm-up
    for _ in range(repeat):
        for name, model in models.items():
            start = time.perf_counter()
            model(x)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1000 for name, values in samples.items()}


def parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m profiling.bench_int8_linear", __doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=comma_list(int, minimum=1, what="row counts"), default=[1, 16, 256],
                        help="row counts (decode: sequences; prefill: tokens), comma-separated")
    parser.add_argument("--repeat", type=positive(int), default=20, help="timed calls per variant, interleaved")
    parser.add_argument("--threads", type=positive(int), default=1, help="torch threads (a worker on the local cluster has 1)")
    parser.add_argument("--shapes", default="all", help="'all' or in x out pairs, e.g. 896x4864,896x151936")
    parser.add_argument("--check", action="store_true", help="also assert bit-identical sums and batch invariance")
    return parser


def shapes_from(text: str) -> tuple[tuple[int, int], ...]:
    if text == "all":
        return SHAPES
    return tuple(tuple(int(n) for n in pair.split("x")) for pair in text.split(","))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), quantized engine {torch.backends.quantized.engine}; "
          "median ms per call")
    names = None
    with torch.inference_mode():
        for in_features, out_features in shapes_from(args.shapes):
            models = variants(in_features, out_features)
            if names is None:
                names = list(models)
                print(f"{'shape':>12} {'rows':>5} " + " ".join(f"{n:>27}" for n in names))
            if args.check:
                check(models, max(args.rows))
            for rows in args.rows:
                ms = time_interleaved(models, torch.randn(rows, in_features), args.repeat)
                print(f"{in_features:>5}x{out_features:<6} {rows:>5} " + " ".join(f"{ms[n]:>27.2f}" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
