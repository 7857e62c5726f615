"""Should an encoder stage run on ONNX Runtime instead of PyTorch? Measure, then apply the rule.

    python -m profiling.bench_encoder_runtimes [--stages embed,rerank,sentiment,toxicity]
        [--sizes embed=1:16,rerank=1:10,sentiment=1:8,toxicity=1:8] [--repeat 5] [--queries 16]
        [--min-speedup 1.3] [--opset N] [--per-channel | --no-per-channel] [--export-dir DIR]
        [--out runs/encoder_runtimes]

Per stage, in one process: PyTorch float32 and int8-dynamic (the project's loaders and
variant), and the float32 model exported to ONNX and run by onnxruntime's CPU provider in
float32 and after ORT dynamic int8 quantization, all on the same tokenized inputs
(`profiling.lib.runtimes` has the details). Prints the table and each stage's verdict
and writes `encoder_runtimes.json` under `--out/<timestamp>/`. The settings come from
the environment (`MODEL_SOURCE`, `STANDIN_PROFILE`, `ONLY_CPU`; `TORCH_THREADS` sets both
torch's and ORT's intra-op threads). Exports go to a temporary folder, removed at the end,
unless `--export-dir` keeps them (outside the repository).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from pipeline.config import Settings
from profiling.lib.cli import make_parser, positive, split_list, stage_list
from profiling.lib.report import write_json
from profiling.lib.runtimes import (
    DEFAULT_MIN_SPEEDUP,
    DEFAULT_SIZES,
    STAGES,
    default_opset,
    format_table,
    format_verdicts,
    measure_stage,
    rule_text,
    verdict,
)

DEFAULT_OUT = Path("runs/encoder_runtimes")
REPO = Path(__file__).resolve().parents[1]


def parse_sizes(raw: str) -> dict[str, tuple[int, int]]:
    """'embed=1:16,rerank=2:10' -> those stages' (one, batch) item counts over the defaults."""
    sizes = dict(DEFAULT_SIZES)
    for item in split_list(raw):
        stage, _, pair = item.partition("=")
        one, _, batch = pair.partition(":")
        if stage.strip() not in STAGES or not (one.strip().isdigit() and batch.strip().isdigit()) \
                or not 1 <= int(one) < int(batch):
            raise argparse.ArgumentTypeError(f"{item!r}: expected STAGE=ONE:BATCH with a stage of "
                                             f"{', '.join(STAGES)} and 1 <= ONE < BATCH")
        sizes[stage.strip()] = (int(one), int(batch))
    return sizes


def _export_dir(raw: str) -> Path:
    path = Path(raw).resolve()
    if path == REPO or REPO in path.parents:
        raise argparse.ArgumentTypeError(f"{raw!r}: exports must not go into the repository ({REPO})")
    return path


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_encoder_runtimes", __doc__.split("\n\n")[0])
    p.add_argument("--stages", type=stage_list(STAGES), default=",".join(STAGES), help="encoder stages, comma-separated")
    p.add_argument("--sizes", type=parse_sizes, default=",".join(f"{s}={a}:{b}" for s, (a, b) in DEFAULT_SIZES.items()),
                   help="items timed per stage, STAGE=ONE:BATCH (rerank: (query, document) pairs)")
    p.add_argument("--repeat", type=positive(int), default=5, help="interleaved timings per runtime and size (median)")
    p.add_argument("--queries", type=positive(int), default=16,
                   help="fidelity set: queries / answers (rerank: requests of ten pairs)")
    p.add_argument("--min-speedup", type=positive(float), default=DEFAULT_MIN_SPEEDUP,
                   help="the rule: ORT must be this many times faster than PyTorch int8-dynamic at both sizes")
    p.add_argument("--opset", type=positive(int), default=default_opset(),
                   help="ONNX opset (the newest the installed torch's TorchScript exporter writes)")
    p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True,
                   help="ORT int8 weights with one scale per output channel (as the project's int8), else per tensor")
    p.add_argument("--export-dir", type=_export_dir, default=None,
                   help="keep the ONNX files in a new <timestamp> folder here; unset: a temporary folder, removed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="a <timestamp> folder is made under it")
    return p


def run(args: argparse.Namespace, settings: Settings, workdir: Path, progress) -> dict:
    import torch

    from pipeline.device import thread_budget
    from pipeline.models import resolve_model_source
    threads = thread_budget(settings.models.torch_threads)
    torch.set_num_threads(threads)
    source = resolve_model_source(settings)
    stages = {}
    for stage in args.stages:
        result = measure_stage(stage, source, sizes=args.sizes[stage], queries=args.queries, repeat=args.repeat,
                               threads=threads, opset=args.opset, per_channel=args.per_channel, workdir=workdir,
                               progress=progress)
        result["verdict"] = verdict(stage, result["figures"], args.min_speedup)
        stages[stage] = result
        # each stage's rows as soon as they exist: a long run cut short still leaves its figures in the log
        progress(f"{stage} done\n{format_table({stage: result})}\n{format_verdicts({stage: result})}")
    return stages


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings.from_env(dict(os.environ if env is None else env))
    progress = lambda line: print(f"bench_encoder_runtimes: {line}", file=sys.stderr, flush=True)  # noqa: E731
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.export_dir is not None:
        workdir = args.export_dir / stamp
        stages = run(args, settings, workdir, progress)
    else:
        with tempfile.TemporaryDirectory(prefix="encoder-runtimes-") as tmp:
            stages = run(args, settings, Path(tmp), progress)
    from profiling.select_variants import STANDIN_WARNING, machine_lines
    header = machine_lines(settings) + ([STANDIN_WARNING] if settings.models.model_source == "standin" else [])
    header.append(f"repeat {args.repeat}, fidelity set {args.queries}, opset {args.opset}, ORT int8 "
                  f"{'per channel' if args.per_channel else 'per tensor'}")
    out = args.out / stamp
    path = write_json(out / "encoder_runtimes.json", {
        "header": header, "rule": rule_text(args.min_speedup), "args": vars(args),
        "verdicts": {s: r["verdict"].adopt or "pytorch" for s, r in stages.items()}, "stages": stages})
    print("\n".join(header))
    print(format_table(stages))
    print(f"rule: {rule_text(args.min_speedup)}")
    print(format_verdicts(stages))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
