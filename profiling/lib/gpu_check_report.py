"""What profiling.gpu_check prints: its table of figures per precision, each phase's stage breakdown, and the
service's own overhead against a GPU request."""
from __future__ import annotations

from typing import Any

SEQUENCES = (1, 8, 32)  # the running sequences a decode step is timed at


def cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: dict[str, dict]) -> str:
    lines = ["| | idle request | idle after the loads | concurrency 8 | concurrency 32 | decode step, 1 / 8 / 32 sequences "
             "| CUDA graphs |", "|---|---|---|---|---|---|---|"]
    for precision, r in rows.items():
        steps = " / ".join(cell(s, ".1f") for s in r.get("steps") or [None] * len(SEQUENCES))
        graphs = " / ".join(cell(g, "d") for g in r.get("graphs") or [None] * len(SEQUENCES))
        lines.append(f"| {precision} | {cell(r.get('idle'), '.2f')} s | {cell(r.get('idle_warm'), '.2f')} s | "
                     f"{cell(r.get('c8'), '.1f')} req/min | "
                     f"{cell(r.get('c32'), '.1f')} req/min | {steps} ms | {graphs} |")
    return "\n".join(lines)


def breakdown_table(rows: dict[str, dict], phase: str = "c32") -> str:
    """Each precision's stages in one loadgen phase (`idle`, `c8`, `c32`, `idle_warm`), one line each; for the idle
    ones, beside each stage its batch of one timed in-process (where the check timed it)."""
    idle = phase.startswith("idle")
    lines = ["| precision | node | stage | items | mean batch | run ms a batch | run ms an item | wait ms an item |"
             + (" in-process ms a batch of one |" if idle else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if idle else "")]
    for precision, r in rows.items():
        in_process = r.get("in_process_ms") or {}
        for s in r.get(f"{phase}_stages") or []:
            lines.append(f"| {precision} | {s['node']} | {s['stage']} | {s['items']:.0f} | {cell(s['mean_batch'], '.2f')} | "
                         f"{cell(s['run_ms_per_batch'], '.1f')} | {cell(s['run_ms_per_item'], '.1f')} | "
                         f"{cell(s['wait_ms_per_item'], '.1f')} |"
                         + (f" {cell(in_process.get(s['stage']), '.1f')} |" if idle else ""))
    return "\n".join(lines)


def engine_lines(rows: dict[str, dict], phase: str = "c32") -> str:
    """Each node's engine over one loadgen phase: its decode steps, its time a step (the generate stage's run over
    its steps: the prefills between them included) and the sequences a step held."""
    return "\n".join(f"{precision} {s['node']}: {s['decode_steps']:.0f} decode steps, "
                     f"{cell(s['engine_ms_per_step'], '.2f')} ms of the engine a step, {s['sequences_per_step']:.2f} sequences a step"
                     for precision, r in rows.items() for s in r.get(f"{phase}_stages") or [] if s.get("decode_steps"))


def gil_lines(rows: dict[str, dict], phase: str = "c32") -> str:
    """Node 1's threads by their GIL samples over one phase (where --spy recorded them), each with its most sampled
    frames: whether the engine's thread waits for the GIL or for the device."""
    lines = []
    for precision, r in rows.items():
        for thread, seen in (r.get(f"{phase}_gil") or {}).items():
            lines.append(f"{precision} node 1 GIL: {thread} {seen['samples']} samples; "
                         + "; ".join(f"{frames} {n}" for frames, n in list(seen["top"].items())[:3]))
    return "".join("\n" + line for line in lines)


def floor_line(rows: dict[str, dict], floor: dict[str, Any] | None) -> str:
    """The service's own overhead at 32 clients (null models on this host, `profiling.overhead_floor`) against each
    precision's request at 32 clients in the cluster (p50s): the issue's target is at most 10 %."""
    if not floor:
        return "the floor at 32 clients: not measured"
    parts = [f"the floor at {floor['clients']} clients (null models, this host): {floor['p50_ms']:.1f} ms p50, "
             f"{cell(floor.get('cpu_ms'), '.1f')} ms of the nodes' CPU a request, {floor['requests_per_minute']:.1f} req/min"]
    for precision, r in rows.items():
        if r.get("c32_p50_s"):
            parts.append(f"{precision}: {100 * floor['p50_ms'] / (1000 * r['c32_p50_s']):.1f} % of its request's "
                         f"{r['c32_p50_s']:.2f} s at 32 clients")
    return "; ".join(parts)
