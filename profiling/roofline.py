"""The roofline of one request on this CPU: per stage, the arithmetic and the bytes one request needs, against this
CPU's measured matmul peaks and memory bandwidth, in every precision.

Shapes come from the configured models' configs (no weights are loaded; MODEL_SOURCE=standin
STANDIN_PROFILE=faithful carries the real configs offline). Token lengths are the real tokenizers' counts for one
reference query: the query (embed); the query with ten documents, truncated at 512 (rerank); the chat prompt with
the top three (prefill); an answer of 400-512 characters cut as the classifiers cut it (sentiment, toxicity). The
documents are the support corpus's, or with --documents DIR those of a data build's documents.db (what a
protocol's requests fetch: a course build's rows are a tenth of a support article's tokens). Peaks: float32, bfloat16 and int8 (`torch._int_mm`) matmuls and a sum and a copy of a large tensor, each
the median of --rounds. Floors are given for each variant on every stage and for PRECISION=fast's mix on this CPU:
one idle request (the stages in sequence) and --concurrency requests served together (weights read once per pass and
per decode step for all of them).

--measured FILE.json: seconds by key (embed, rerank, prefill, decode, generate, sentiment, toxicity, request;
concurrency_rpm in requests/min), flat or as {"precision": NAME, "times": {...}}; --microbench DIR: each stage's
batch-1 median from microbench_<stage>.csv (the file's figures win where both give one). They are printed as
multiples of the floor of --measured-precision (or of the file's "precision"). Writes roofline.json into --out or a
fresh runs/roofline-<UTC time>/."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline import spec
from pipeline.config import PRECISION_VARIANTS, ConfigError, Settings
from profiling.lib import roofline as roof
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.machine_peaks import measure_machine
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, text_table, write_json

FAST = "fast"
PLANS = PRECISION_VARIANTS + (FAST,)
MICROBENCH_STAGES = ("embed", "rerank", "generate", "sentiment", "toxicity")


def sentence_projection(source, name: str) -> int:
    """The output width of the sentence-transformers Dense module in `name`'s modules.json, 0 if none."""
    from huggingface_hub import hf_hub_download

    def read(filename: str) -> Any:
        return json.loads(Path(hf_hub_download(name, filename, **source.hf_kwargs(name))).read_text())
    dense = [m for m in read("modules.json") if m["type"].endswith(".Dense")]
    return sum(read(f"{m['path']}/config.json")["out_features"] for m in dense)


def load_models(source) -> roof.Models:
    """Each model's shape from its config (config.json only)."""
    from transformers import AutoConfig

    def encoder(name: str, labels: int | None = None, projection: int = 0) -> roof.EncoderShape:
        return roof.EncoderShape.from_config(AutoConfig.from_pretrained(name, **source.hf_kwargs(name)), labels, projection)
    return roof.Models(embed=encoder(spec.EMBEDDER_MODEL, labels=0,  # a pooler, no labels
                                     projection=sentence_projection(source, spec.EMBEDDER_MODEL)),
                       rerank=encoder(spec.RERANKER_MODEL),
                       generate=roof.DecoderShape.from_config(
                           AutoConfig.from_pretrained(spec.GENERATOR_MODEL, **source.hf_kwargs(spec.GENERATOR_MODEL))),
                       sentiment=encoder(spec.SENTIMENT_MODEL), toxicity=encoder(spec.TOXICITY_MODEL))


def request_tokens(source, query_index: int, new_tokens: int, rerank_tokens: Sequence[int] | None = None,
                   documents_dir: Path | None = None) -> tuple[roof.RequestTokens, dict[str, Any]]:
    """One reference request's token lengths, counted by each model's own tokenizer, and what was counted: over
    the support corpus, or the documents of `documents_dir`'s documents.db."""
    from transformers import AutoTokenizer

    from pipeline.device import Placement
    from pipeline.reranker import Reranker
    from profiling.lib.inputs import answer_texts, document_pool, rerank_inputs

    def tokenizer(name: str) -> Any:
        return AutoTokenizer.from_pretrained(name, **source.hf_kwargs(name))

    pool = document_pool(documents_dir)
    request = rerank_inputs(pool, 1, query_index)[0]
    answer = spec.classifier_text(answer_texts(pool, 1, query_index)[0])
    if rerank_tokens is None:
        # The reranker's own tokenization (no model is needed to count).
        reranker = Reranker(tokenizer(spec.RERANKER_MODEL), None, Placement("cpu", "float32"))
        encoded = reranker.encode_pairs([(request.query, d.content) for d in request.documents])
        rerank_tokens = [len(ids) for ids in encoded["input_ids"]]
    generator = tokenizer(spec.GENERATOR_MODEL)
    # As Generator.prompt renders it: the contract's messages through the chat template.
    prompt = generator.apply_chat_template(spec.build_messages(request.query, request.documents), tokenize=False,
                                           add_generation_prompt=True)

    def classifier(name: str) -> int:
        return len(tokenizer(name)(answer, truncation=True, max_length=spec.TRUNCATE_LENGTH).input_ids)

    tokens = roof.RequestTokens(query=len(tokenizer(spec.EMBEDDER_MODEL)(request.query).input_ids),
                                rerank=tuple(rerank_tokens), prompt=len(generator(prompt).input_ids),
                                new_tokens=new_tokens, sentiment=classifier(spec.SENTIMENT_MODEL),
                                toxicity=classifier(spec.TOXICITY_MODEL))
    return tokens, {"query": request.query, "answer_chars": len(answer),
                    "documents": str(documents_dir) if documents_dir is not None else "support corpus",
                    "rerank_documents": [d.title for d in request.documents]}


def stage_plans() -> dict[str, dict[str, str]]:
    """Every variant on every stage, and PRECISION=fast's choice for this CPU."""
    from pipeline.cpu_features import cpu_supports_bf16
    from pipeline.precision_policy import FAST as FAST_TABLE
    from pipeline.precision_policy import hardware_kind
    stages = list(map(str, spec.MODEL_STAGES))
    plans = {variant: {stage: variant for stage in stages} for variant in PRECISION_VARIANTS}
    plans[FAST] = dict(FAST_TABLE[hardware_kind("cpu", cpu_supports_bf16)])
    return plans


class MeasuredError(ValueError):
    """A measured-times file or folder that cannot be read as one."""


def read_measured(path: Path) -> tuple[str | None, dict[str, float]]:
    """(its precision or None, its figures) from a --measured JSON file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise MeasuredError(f"--measured {path}: {exc}") from None
    precision = None
    if isinstance(data, dict) and "times" in data:
        precision, data = data.get("precision"), data["times"]
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in data.values()):
        raise MeasuredError(f"--measured {path}: expected a JSON object of positive numbers by key")
    if precision is not None and precision not in PLANS:
        raise MeasuredError(f"--measured {path}: precision {precision!r} is not one of {', '.join(PLANS)}")
    return precision, {str(k): float(v) for k, v in data.items()}


def read_microbench(folder: Path) -> dict[str, float]:
    """Each stage's batch-1 median seconds from microbench_<stage>.csv files in `folder`."""
    times = {}
    for stage in MICROBENCH_STAGES:
        path = Path(folder) / f"microbench_{stage}.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("batch_size") == "1"]
        if rows:
            times[stage] = float(rows[0]["batch_s_median"])
    if not times:
        raise MeasuredError(f"--microbench {folder}: no microbench_<stage>.csv with a batch-size-1 row")
    return times


def measured_figures(args: argparse.Namespace) -> tuple[str, dict[str, float]]:
    precision, times = args.measured_precision, {}
    if args.microbench is not None:
        times.update(read_microbench(args.microbench))
    if args.measured is not None:
        named, given = read_measured(args.measured)
        precision = named or precision
        times.update(given)
    return precision, times


def plan_record(plan: roof.PlanFloor) -> dict[str, Any]:
    """A plan as JSON-ready values, each floor with its bound and the totals."""
    def floors(by_row: Mapping[str, roof.Floor]) -> dict[str, Any]:
        return {row: {**dataclasses.asdict(f), "bound": f.bound} for row, f in by_row.items()}
    return {"name": plan.name, "precisions": plan.precisions, "idle": floors(plan.idle), "idle_s": plan.idle_s,
            "concurrency": plan.concurrency, "concurrent": floors(plan.concurrent),
            "concurrent_s": plan.concurrent_s, "concurrent_rpm": plan.concurrent_rpm}


def format_work(models: roof.Models, tokens: roof.RequestTokens) -> str:
    works = roof.row_works(models, tokens)
    totals = {row: sum(works[row], roof.Work()) for row in roof.ROWS}
    lengths = {"embed": tokens.query, "rerank": f"{len(tokens.rerank)}x~{statistics.mean(tokens.rerank or [0]):.0f}",
               "prefill": tokens.prompt, "decode": f"{tokens.new_tokens - 1} steps", "sentiment": tokens.sentiment,
               "toxicity": tokens.toxicity}
    columns = [("stage", "<10"), ("tokens", ">12"), ("GMAC lin", ">10.2f"), ("GMAC attn", ">10.3f"),
               ("M weights", ">11.1f"), ("passes", ">8"), ("M KV read", ">11.1f")]
    return text_table(columns, [(row, lengths[row], totals[row].linear_macs / 1e9, totals[row].attention_macs / 1e9,
                                 works[row][0].weights / 1e6, len(works[row]), totals[row].kv_reads / 1e6)
                                for row in roof.ROWS])


def format_floors(plans: Sequence[roof.PlanFloor]) -> str:
    """Floor ms per row and plan (c: compute-bound, m: memory-bound), then the request totals."""
    header = f"{'floor':<22}" + "".join(f"{p.name:>15}" for p in plans)
    lines = [header, "-" * len(header)]
    for row in roof.ROWS:
        lines.append(f"{row + ' ms':<22}" + "".join(f"{p.idle[row].floor_s * 1e3:>13.1f} {p.idle[row].bound[0]}"
                                                    for p in plans))
    concurrency = plans[0].concurrency if plans else 0
    lines.append(f"{'idle request s':<22}" + "".join(f"{p.idle_s:>15.3f}" for p in plans))
    lines.append(f"{f'{concurrency} together s':<22}" + "".join(f"{p.concurrent_s:>15.3f}" for p in plans))
    lines.append(f"{f'c={concurrency} req/min':<22}" + "".join(f"{p.concurrent_rpm:>15.1f}" for p in plans))
    fast = next(p for p in plans if p.name == FAST)
    lines.append("  (c: compute-bound, m: memory-bound; fast = " + ", ".join(
        f"{row} {precision}" for row, precision in fast.precisions.items() if row != "decode")
        + "; PRECISION=auto = the bfloat16 column on a bf16 CPU, the float32 column on others)")
    return "\n".join(lines)


def format_comparisons(plan: roof.PlanFloor, comparisons: Sequence[roof.Comparison]) -> str:
    columns = [(f"measured ({plan.name})", "<26"), ("measured", ">12.3f"), ("floor", ">12.3f"), ("x floor", ">9.2f"),
               ("of roofline", ">13.0%"), ("", "")]
    return text_table(columns, [(c.what, c.measured, c.floor, c.times_floor, c.fraction, f"  {c.unit}")
                                for c in comparisons])


def check_documents(folder: Path) -> None:
    """Raise ConfigError where `folder` holds no readable documents.db with documents (checked before anything is
    measured)."""
    import sqlite3

    from pipeline.docstore import DocumentStore
    from profiling.lib.inputs import max_doc_id
    try:
        with DocumentStore(folder) as store:
            max_doc_id(store.path)  # ValueError where it holds none
    except (OSError, ValueError, sqlite3.Error) as exc:
        raise ConfigError(f"--documents {folder}: no documents.db with documents to read ({exc})") from exc


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.roofline", __doc__)
    p.add_argument("--threads", type=positive(int), default=2, help="torch threads the peaks are measured on")
    p.add_argument("--matmul-size", type=positive(int), default=2048, help="n of the n x n x n matmuls timed")
    p.add_argument("--bandwidth-mib", type=positive(int), default=256,
                   help="MiB of the tensor summed and copied (well above the caches)")
    p.add_argument("--rounds", type=positive(int), default=5, help="timed rounds of each peak (the median is used)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--concurrency", type=positive(int), default=8, help="requests served together for throughput")
    p.add_argument("--new-tokens", type=positive(int), default=spec.MAX_NEW_TOKENS, help="tokens generated")
    p.add_argument("--query-index", type=int, choices=range(len(spec.REFERENCE_QUERIES)), default=0,
                   metavar="0-7", help="which reference query (SPEC's client order)")
    p.add_argument("--rerank-tokens", type=comma_list(int, minimum=1, what="token counts", example="255,240"),
                   default=None, help="token lengths of the rerank pairs; unset: tokenized from the documents")
    p.add_argument("--documents", type=Path, default=None,
                   help="a data build's folder (its documents.db): the request's documents; unset: the support corpus")
    p.add_argument("--measured", type=Path, default=None, help="a JSON file of measured seconds by key (see above)")
    p.add_argument("--microbench", type=Path, default=None, help="a profiling.microbench output folder")
    p.add_argument("--measured-precision", choices=PLANS, default=FAST,
                   help="the precision plan the measured figures ran in (a --measured file's own wins)")
    add_out(p, "roofline")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env(env)
        precision, measured = measured_figures(args)
        if args.documents is not None:
            check_documents(args.documents)
    except (ConfigError, MeasuredError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from builders.standins import source_building_standins
    source = source_building_standins(settings)
    models = load_models(source)
    tokens, counted = request_tokens(source, args.query_index, args.new_tokens, args.rerank_tokens,
                                     args.documents)
    machine = measure_machine(args.threads, args.matmul_size, args.bandwidth_mib, args.rounds, args.warmup)
    plans = [roof.plan_floor(name, stages, models, tokens, machine, args.concurrency)
             for name, stages in stage_plans().items()]
    by_name = {p.name: p for p in plans}
    try:
        comparisons = roof.compare(by_name[precision], measured) if measured else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"models: {source.describe()}; {machine.describe()}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs when measured "
          "(a busy machine measures low peaks)")
    print(format_work(models, tokens), format_floors(plans), sep="\n\n")
    if comparisons:
        print("\n" + format_comparisons(by_name[precision], comparisons))
    out = run_folder("roofline", args.out)
    path = write_json(out / "roofline.json", {
        "machine": machine, "models": models, "tokens": tokens, "counted": counted,
        "load_average_1min": os.getloadavg()[0], "model_source": source.describe(),
        "plans": [plan_record(p) for p in plans],
        "measured": {"precision": precision, "comparisons": [{**vars(c), "fraction": c.fraction}
                                                             for c in comparisons]},
        "args": vars(args), "provenance": local_record(settings=settings)}, strict=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
