"""The continuous engine's host time per decode step, with a model whose arithmetic costs nothing.

At 1, 8 and 32 rows (all decoding), for the `null` model (fixed logits: the engine alone: scheduler,
slots, runner, token choice) and the `qwen` one (the real Qwen2 decoder with the faithful layer count and
every width tiny, in --precision's variant: the model's glue, its non-matmul ops): host ms per step (the
mean of --steps steps, best of --rounds rounds), of which its products (every op that multiplies by a
weight, engine_step.PRODUCT_OPS: one step's recorded and replayed alone, best of --rounds; the output
layer's over the real vocabulary is no tiny matmul) and the rest, outside the products; and the aten ops
one step dispatches (counted by a TorchDispatchMode), with the most frequent ones.

--compare REV measures commit REV too, side by side in the same run: REV is checked out into a
temporary folder (git archive) and measured by this checkout's code (profiling/lib/engine_step.py run there),
the two alternated round by round. REV must have pipeline/null_models.py. Writes engine_overhead.json
into --out (default: a fresh runs/engine_overhead-<UTC time>/).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.config import Settings
from profiling.lib import engine_step
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.provenance import REPO_ROOT
from profiling.lib.report import run_folder, text_table
from profiling.lib.revisions import checkout, write_compared

TOOL = "engine_overhead"
STEP_SCRIPT = Path(engine_step.__file__).resolve()


def parser():
    p = make_parser("python -m profiling.engine_overhead", __doc__)
    p.add_argument("--rows", type=comma_list(int, minimum=1), default=[1, 8, 32], help="rows decoding at once")
    p.add_argument("--models", type=comma_list(str), default=["null", "qwen"], help="null, qwen or both")
    p.add_argument("--steps", type=positive(int), default=50, help="steps timed per round")
    p.add_argument("--rounds", type=positive(int), default=3, help="rounds per commit (alternated with --compare's)")
    p.add_argument("--prompt-tokens", type=positive(int), default=600, help="each row's prompt (a RAG prompt's size)")
    p.add_argument("--precision", default="float32", help="the qwen model's variant (PRECISION's names)")
    p.add_argument("--layers", type=positive(int), default=engine_step.QWEN_LAYERS, help="the qwen model's layers")
    p.add_argument("--threads", type=positive(int), default=1, help="torch threads")
    p.add_argument("--top", type=positive(int), default=12, help="ops listed per row count")
    p.add_argument("--compare", default="", metavar="REV", help="a commit measured beside this checkout")
    p.add_argument("--quick", action="store_true", help="a check that the tool works: 1 and 4 rows (prompts of two prefill chunks), few steps, 2 layers")
    add_out(p, TOOL)
    return p


def measure_in(tree: Path, spec: dict, scratch: Path) -> dict:
    """engine_step.measure(spec) run in a fresh process on `tree`'s pipeline."""
    spec_path, out = scratch / "spec.json", scratch / f"out-{os.getpid()}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # Its progress and errors on our stderr, as they come.
    done = subprocess.run([sys.executable, str(STEP_SCRIPT), str(spec_path), str(out)], cwd=tree, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {tree} failed (exit {done.returncode}): its error is above")
    return json.loads(out.read_text())


def merge(rounds: list[dict]) -> dict:
    """Rounds of measure() into one: every round's host times listed, the op counts of the first."""
    merged = json.loads(json.dumps(rounds[0]))
    for later in rounds[1:]:
        for kind, by_rows in later.items():
            for rows, result in by_rows.items():
                merged[kind][rows]["host_ms_per_step"] += result["host_ms_per_step"]
    return merged


def outside_products_ms(r: dict) -> float:
    """A step's host ms outside its products (its best round less its products replayed alone)."""
    return min(r["host_ms_per_step"]) - r.get("products_ms_per_step", 0.0)


def table(labelled: dict[str, dict]) -> str:
    columns = [("model", "<7"), ("rows", ">5")]
    for label in labelled:
        columns += [(f"  {label[:12]} ms/step", ">22.3f"), ("  products ms", ">13.3f"),
                    ("  outside ms", ">12.3f"), (f"  {label[:12]} ops/step", ">22")]
    first = next(iter(labelled.values()))
    lines = []
    for kind, by_rows in first.items():
        for rows in by_rows:
            cells: list = [kind, rows]
            for result in labelled.values():
                r = result[kind][rows]
                cells += [min(r["host_ms_per_step"]), r.get("products_ms_per_step", 0.0), outside_products_ms(r),
                          r["ops_per_step"]]
            lines.append(cells)
    return text_table(columns, lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.rounds, args.layers, args.prompt_tokens = [1, 4], 5, 1, 2, 600
    bad = [m for m in args.models if m not in ("null", "qwen")]
    if bad:
        print(f"engine_overhead: --models: unknown {bad}; null, qwen", file=sys.stderr)
        return 2
    from builders.standins import source_building_standins
    # The stand-ins' tokenizer and generation config only (built first if missing); no weights are read.
    source = source_building_standins(Settings.from_env({**os.environ, "MODEL_SOURCE": "standin"}))
    spec = {"models": args.models, "rows": args.rows, "steps": args.steps, "rounds": 1, "precision": args.precision,
            "layers": args.layers, "threads": args.threads, "prompt_tokens": args.prompt_tokens, "top": args.top,
            "source_dir": str(source.cache_dir)}
    out = run_folder(TOOL, args.out)
    labelled: dict[str, list[dict]] = {"here": []}
    with contextlib.ExitStack() as stack:
        trees = {"here": REPO_ROOT}
        if args.compare:
            trees[args.compare] = stack.enter_context(checkout(args.compare))
            labelled[args.compare] = []
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for _ in range(args.rounds):  # alternated: drift on the machine falls on both alike
            for label, tree in trees.items():
                labelled[label].append(measure_in(tree, spec, scratch))
    results = {label: merge(rounds) for label, rounds in labelled.items()}
    print(table(results))
    for label, result in results.items():
        for kind, by_rows in result.items():
            for rows, r in by_rows.items():
                top = ", ".join(f"{name} {n}" for name, n in r["top_ops"])
                print(f"{label} {kind} {rows} rows: top ops per step: {top}")
    print(f"results in {write_compared(out, TOOL, args, results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
