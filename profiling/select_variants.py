"""Pick each model stage's precision variant on this machine and write it as an env file.

For every stage and candidate variant (default: those this device supports) a fresh subprocess loads only that model
in that variant, as the service does, and measures:

- speed: the median of `--repeat` timings of one item and of a typical batch (`--batch`), after a
  warm-up; with `--rounds R` every subprocess runs R times, the variants' order rotated each
  round (a busy neighbour slows every variant alike);
- memory: the subprocess's peak RSS (VmHWM: nothing of any other variant) and the model's bytes;
- fidelity against float32 on `--queries N` queries (the SPEC's eight, then support article
  titles): embedding cosine; rerank top-3 agreement, Spearman and Kendall rank correlation;
  the classifiers' label agreement; the LLM's exact match of greedy token ids, first differing
  token, teacher-forced top-1 agreement and logit drift. The LLM is timed and read through the
  continuous engine the service runs (warmed as a worker warms it), not Hugging Face `generate`.

The rule: per stage, the fastest variant at the typical batch among those whose every fidelity metric reaches its
stage's minimum (`--<stage>-<metric>`); float32 when none does. Writes `precision.env` (`EMBED_PRECISION=...` lines
a deployer sources, the figures in its comments), `select_variants.json` and `select_variants.csv` under
`--out/<timestamp>/`. Fidelity on random-weight stand-ins is no worst case: on a real encoder int8-dynamic drifted
about 10x more than on its same-shape stand-in (profiling.real_fidelity); on stand-ins, embed's cosines are scaled by
that report's factors (`--real-fidelity`), other stages' figures are the stand-ins' own (said in the output)."""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from pipeline import spec
from pipeline.config import REPO_ROOT, Settings
from profiling.lib import fidelity as fid
from profiling.lib import inputs
from profiling.lib.cli import comma_list, positive, split_list, stage_list
from profiling.lib.fidelity import DEFAULT_THRESHOLDS, REFERENCE, Measurement, check, choose, env_file, rule_text
from profiling.lib.fidelity import fidelity as fidelity_of
from profiling.lib.machine_peaks import cpu_name
from profiling.lib.models import MemoryProbe, worker_settings
from profiling.lib.provenance import local_record
from profiling.lib.report import text_table, write_csv, write_json

STAGES = tuple(map(str, spec.MODEL_STAGES))
# A typical batch per stage in service: a few requests' worth under moderate load (rerank:
# requests of ten documents each; generate: sequences decoding together).
DEFAULT_BATCH = {"embed": 8, "rerank": 2, "generate": 4, "sentiment": 8, "toxicity": 8}
DEFAULT_OUT = Path("runs/select_variants")
# profiling.real_fidelity's report on all-MiniLM-L6-v2 (docs/performance.md, "Fidelity on real weights").
REAL_FIDELITY = REPO_ROOT / "docs" / "real_fidelity.json"
STANDIN_WARNING = ("model source is stand-ins (random weights): NOT a worst case: trained weights' outlier "
                   "channels make int8 drift more (embed: scaled by --real-fidelity's factors); rerun on real models")


def _workload(stage: str, model, n: int, max_new: int, batch: int,
              prefill_chunk: int) -> tuple[list, Callable[[list], object], Callable[[list], list]]:
    """(inputs, the stage's batch call to time, outputs to compare per item) for n queries, in batches of
    at most `batch` (the LLM's: its engine's slots, prefilled `prefill_chunk` tokens at a time)."""
    queries = inputs.query_set(n)
    if stage == "embed":
        return queries, model.embed, lambda items: model.embed(items).tolist()
    pool = inputs.document_pool(None)
    if stage == "rerank":
        from pipeline.reranker import RerankRequest
        # ten documents each as in service, asked with the varied query set instead of the eight
        requests = [RerankRequest(q, r.documents) for q, r in zip(queries, inputs.rerank_inputs(pool, n))]
        return requests, model.rerank, lambda items: [
            model.score_pairs([(r.query, d.content) for d in r.documents]) for r in items]
    if stage == "generate":
        from profiling.lib.models import bench_engine, engine_generate_ids
        prompts = inputs.generation_prompts(model, queries, pool)
        # The continuous engine the service runs, as many slots as the typical batch, every answer max_new long.
        engine = bench_engine(model, batch, prompts, max_new, prefill_chunk=prefill_chunk)
        run = lambda items: engine_generate_ids(engine, items, max_new)  # noqa: E731
        return prompts, run, lambda items: [{"ids": ids, **_read_prompt(model, prompt)}
                                            for prompt, ids in zip(items, run(items))]
    return inputs.answer_texts(pool, n), model.classify, model.classify


def _read_prompt(generator, prompt: list[int], chunk: int = 128) -> dict:
    """The LLM reading one prompt alone: the argmax after every position (teacher-forced) and the
    logits after the last one (float32 bytes, base64). The head runs in chunks of positions: the
    whole prompt's logits would be prompt length x vocabulary floats."""
    import torch
    ids = torch.tensor([prompt], device=generator.placement.device)
    with torch.inference_mode():
        hidden = generator.model.model(input_ids=ids).last_hidden_state
        head = generator.model.lm_head
        top1 = [t for start in range(0, hidden.shape[1], chunk)
                for t in head(hidden[:, start:start + chunk]).argmax(dim=-1)[0].tolist()]
        last = head(hidden[:, -1:]).float()[0, 0].cpu().numpy()
    return {"prompt_top1": top1, "last_logits": base64.b64encode(last.tobytes()).decode()}


def _times_ms(run: Callable[[list], object], items: list, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run(items)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def measure_one(job: Mapping) -> dict:
    """Load one stage in one variant in this (fresh) process and measure it: what a --worker prints."""
    from pipeline.device import Placement, select_device
    from pipeline.precision import model_nbytes
    from pipeline.precision_policy import LOAD_DTYPE
    from profiling.lib.models import model_class
    settings, source = worker_settings()
    stage, variant, batch = job["stage"], job["variant"], job["batch"]
    probe = MemoryProbe()
    placement = Placement(select_device(settings.models.only_cpu), LOAD_DTYPE[variant], variant)
    model = model_class(stage).load(source, placement)
    items, run, outputs_of = _workload(stage, model, job["queries"], job["max_new_tokens"], batch,
                                       settings.generate.prefill_chunk)
    outputs = [o for start in range(0, len(items), batch) for o in outputs_of(items[start:start + batch])]
    run(items[:1])  # the fidelity pass warmed the batch shapes; this the one-item shape
    return {"one_ms": _times_ms(run, items[:1], job["repeat"]),
            "batch_ms": _times_ms(run, inputs.cycled(items, batch), job["repeat"]),
            "peak_rss_mib": probe.peak_mib() if probe.resettable else math.nan,
            "model_mib": model_nbytes(model.model) / 2**20, "outputs": outputs}


def run_job(job: dict, env: Mapping[str, str]) -> dict:
    """measure_one in a fresh interpreter, so no variant's memory or caches reach another's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "profiling.select_variants", "--worker", json.dumps({**job, "out": str(out)})]
        done = subprocess.run(cmd, env=dict(env), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{job['stage']}/{job['variant']} failed (rc {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return json.loads(out.read_text())


def measure_all(args: argparse.Namespace, env: Mapping[str, str], progress=print) -> list[Measurement]:
    """Every (stage, variant) for args.rounds rounds, variants rotated each round; medians over rounds."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for stage in args.stages:
            shift = r % len(args.variants)
            for variant in args.variants[shift:] + args.variants[:shift]:
                progress(f"select_variants: round {r + 1}/{args.rounds} {stage} {variant}")
                job = {"stage": stage, "variant": variant, "batch": args.batch[stage], "queries": args.queries,
                       "repeat": args.repeat, "max_new_tokens": args.max_new_tokens}
                runs.setdefault((stage, variant), []).append(run_job(job, env))
    return [_summarize(stage, variant, results, runs.get((stage, REFERENCE)), args)
            for (stage, variant), results in runs.items()]


def _decoded(stage: str, outputs: list) -> list:
    """Outputs as the fidelity figures take them: the LLM's last logits back to an array."""
    if stage != "generate":
        return outputs
    return [{**o, "last_logits": np.frombuffer(base64.b64decode(o["last_logits"]), dtype=np.float32)}
            for o in outputs]


def _summarize(stage: str, variant: str, results: list[dict], reference: list[dict] | None,
               args: argparse.Namespace) -> Measurement:
    first = results[0]  # outputs are deterministic: round 1's stand for all
    figures = fidelity_of(stage, _decoded(stage, reference[0]["outputs"]), _decoded(stage, first["outputs"])) \
        if reference else {}
    figures = fid.with_real_drift(stage, variant, figures, getattr(args, "drift", {}))
    m = Measurement(stage, variant, statistics.median(t for r in results for t in r["one_ms"]),
                    statistics.median(t for r in results for t in r["batch_ms"]), args.batch[stage],
                    max(r["peak_rss_mib"] for r in results), first["model_mib"], figures)
    return check(m, args.thresholds)


def format_table(rows: Sequence[Measurement], chosen: Mapping[str, str]) -> str:
    columns = [("stage", "<10"), ("variant", "<14"), ("one ms", ">9.1f"), ("batch ms", ">10.1f"), ("  B", ">4"),
               ("x f32", ">7"), ("peak MiB", ">10.0f"), ("model MiB", ">10.0f"), ("  pass", "<8"),
               ("fidelity vs float32", "")]
    lines = []
    for m in rows:
        ref = next((r for r in rows if r.stage == m.stage and r.variant == REFERENCE), None)
        ratio = ref.batch_ms / m.batch_ms if ref and m.batch_ms else math.nan
        mark = ("yes" if m.passed else "no") + (" *" if chosen.get(m.stage) == m.variant else "")
        figures = (", ".join(f"{k} {v:.4g}" for k, v in m.fidelity.items()) or "-") + \
            (f"  [{'; '.join(m.failed)}]" if m.failed else "")
        lines.append((m.stage, m.variant, m.one_ms, m.batch_ms, m.batch, f"{ratio:.2f}x", m.peak_rss_mib, m.model_mib,
                      f"  {mark}", figures))
    return text_table(columns, lines) + "\nx f32: float32's batch time / the variant's (above 1 = faster); * = chosen"


def header_lines(settings: Settings, args: argparse.Namespace, rows: Sequence[Measurement],
                 chosen: Mapping[str, str]) -> list[str]:
    """The env file's comments: when, on what machine and models, by which rule, and the table."""
    from pipeline.cpu_features import cpu_supports_bf16
    from pipeline.device import select_device, thread_budget
    from pipeline.precision_policy import hardware_kind
    device, models = select_device(settings.models.only_cpu), settings.models
    standin = models.model_source == "standin"
    return [f"Precision per model stage, chosen by profiling/select_variants.py on {time.strftime('%F %T')}",
            f"machine: {platform.node()}, {cpu_name()}, {os.cpu_count()} cores, device {device}, "
            f"hardware kind {hardware_kind(device, cpu_supports_bf16)}",
            f"torch threads: {thread_budget(models.torch_threads)}; load average at the end: "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
            f"model source: {models.model_source}" + (f" ({models.standin_profile})" if standin else ""),
            *([STANDIN_WARNING] if standin else []), *_drift_lines(args), f"rule: {rule_text(args.thresholds)}",
            f"queries {args.queries}, repeat {args.repeat}, rounds {args.rounds}"
            + (f", generate max new tokens {args.max_new_tokens}" if "generate" in args.stages else "")
            + "; median ms one item / typical batch (B), peak RSS MiB:", *format_table(rows, chosen).splitlines()]


def _drift_lines(args: argparse.Namespace) -> list[str]:
    if not getattr(args, "drift", None):
        return []
    told = "; ".join(f"{v} " + ", ".join(f"{m} x{f:.1f}" for m, f in d.items()) for v, d in args.drift.items())
    return [f"embed cosines: the stand-in's drift (1 - cosine) times what real weights showed ({told}; "
            f"{args.real_fidelity}), the stand-in's own as standin_*"]


def write_outputs(out: Path, settings: Settings, args: argparse.Namespace, rows: Sequence[Measurement],
                  chosen: Mapping[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    header = header_lines(settings, args, rows, chosen)
    (out / "precision.env").write_text(env_file(chosen, header))
    write_json(out / "select_variants.json", {"header": header, "rule": rule_text(args.thresholds),
                                              "chosen": chosen, "rows": rows, "args": vars(args),
                                              "provenance": local_record(settings=settings)})
    flat = [{**asdict(m), "fidelity": json.dumps(m.fidelity), "failed": "; ".join(m.failed)} for m in rows]
    write_csv(out / "select_variants.csv", flat, list(Measurement.__dataclass_fields__), float_digits=4)
    return out / "precision.env"


def parse_batches(raw: str) -> dict[str, int]:
    """'embed=8,generate=2' -> those stages' batch sizes over the defaults."""
    batches = dict(DEFAULT_BATCH)
    for item in split_list(raw):
        stage, _, size = item.partition("=")
        if stage.strip() not in STAGES or not size.strip().isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: expected STAGE=N with a stage of {', '.join(STAGES)}, N >= 1")
        batches[stage.strip()] = int(size)
    return batches


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m profiling.select_variants", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--stages", type=stage_list(STAGES), default=",".join(STAGES), help="model stages, comma-separated")
    p.add_argument("--variants", type=comma_list(str, what="variants", example="float32,int8-dynamic"),
                   default=argparse.SUPPRESS,
                   help="candidates (float32 is added: it is the reference); default: what this device supports")
    p.add_argument("--batch", type=parse_batches, default=",".join(f"{k}={v}" for k, v in DEFAULT_BATCH.items()),
                   help="typical batch per stage, STAGE=N comma-separated (rerank: requests of ten documents)")
    p.add_argument("--repeat", type=positive(int), default=3, help="timings per size per round (median)")
    p.add_argument("--rounds", type=positive(int), default=1, help="times every subprocess runs, order rotated")
    p.add_argument("--queries", type=positive(int), default=16, help="queries in the fidelity set")
    p.add_argument("--max-new-tokens", type=positive(int), default=16, help="generate: tokens per answer")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="a <timestamp> folder is made under it")
    for stage, metrics in DEFAULT_THRESHOLDS.items():
        for metric, minimum in metrics.items():
            p.add_argument(f"--{stage}-{metric.replace('_', '-')}", type=float, default=minimum,
                           dest=f"min_{stage}_{metric}", metavar="MIN", help=f"{stage}: pass when {metric} >= MIN")
    p.add_argument("--real-fidelity", default=str(REAL_FIDELITY),
                   help="on stand-ins, scale embed cosine drift by this profiling.real_fidelity report's "
                        "real/stand-in factors; '' for the stand-ins' own figures")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one measurement, as JSON
    return p


def resolve_args(p: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings) -> argparse.Namespace:
    from pipeline.device import select_device
    from pipeline.precision_policy import supported_variants
    supported = supported_variants(select_device(settings.models.only_cpu))
    variants = getattr(args, "variants", None) or list(supported)
    unsupported = [v for v in variants if v not in supported]
    if unsupported:
        p.error(f"--variants: {', '.join(unsupported)} not supported here (expected some of {', '.join(supported)})")
    args.variants = [REFERENCE] + [v for v in dict.fromkeys(variants) if v != REFERENCE]
    use_drift = bool(args.real_fidelity) and settings.models.model_source == "standin"
    if use_drift and not Path(args.real_fidelity).is_file():
        p.error(f"--real-fidelity: {args.real_fidelity} is not a file")
    args.drift = fid.real_drift_factors(json.loads(Path(args.real_fidelity).read_text())) if use_drift else {}
    args.thresholds = {stage: {metric: getattr(args, f"min_{stage}_{metric}") for metric in metrics}
                       for stage, metrics in DEFAULT_THRESHOLDS.items() if stage in args.stages}
    return args


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        Path(job["out"]).write_text(json.dumps(measure_one(job)))
        return 0
    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    args = resolve_args(p, args, settings)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        rows = measure_all(args, env, progress)
    except RuntimeError as exc:
        print(f"select_variants: {exc}", file=sys.stderr)
        return 1
    chosen = choose(rows)
    out = args.out / time.strftime("%Y%m%d-%H%M%S")
    env_path = write_outputs(out, settings, args, rows, chosen)
    if settings.models.model_source == "standin":
        print(f"NOTE: {STANDIN_WARNING}")
    print(format_table(rows, chosen))
    print(f"rule: {rule_text(args.thresholds)}")
    print(env_file(chosen, []), end="")
    print(f"wrote {env_path} (source it: set -a; . {env_path}; set +a) and its .json/.csv beside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
