"""The roofline's tables: the work of one request per stage, the floors per plan, and measured
times against their floors (text for the terminal, a record for JSON)."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Mapping, Sequence

from profiling.lib.roofline import ROWS, Comparison, Floor, Models, PlanFloor, RequestTokens, Work, row_works


def plan_record(plan: PlanFloor) -> dict[str, Any]:
    """A plan as JSON-ready values, each floor with its bound and the totals."""
    def floors(by_row: Mapping[str, Floor]) -> dict[str, Any]:
        return {row: {**dataclasses.asdict(f), "bound": f.bound} for row, f in by_row.items()}
    return {"name": plan.name, "precisions": plan.precisions, "idle": floors(plan.idle), "idle_s": plan.idle_s,
            "concurrency": plan.concurrency, "concurrent": floors(plan.concurrent),
            "concurrent_s": plan.concurrent_s, "concurrent_rpm": plan.concurrent_rpm}


def format_work(models: Models, tokens: RequestTokens) -> str:
    works = row_works(models, tokens)
    lengths = {"embed": str(tokens.query), "rerank": f"{len(tokens.rerank)}x~{_mean(tokens.rerank):.0f}",
               "prefill": str(tokens.prompt), "decode": f"{tokens.new_tokens - 1} steps",
               "sentiment": str(tokens.sentiment), "toxicity": str(tokens.toxicity)}
    header = (f"{'stage':<10}{'tokens':>12}{'GMAC lin':>10}{'GMAC attn':>10}{'M weights':>11}{'passes':>8}"
              f"{'M KV read':>11}")
    lines = [header, "-" * len(header)]
    for row in ROWS:
        total = sum(works[row], Work())
        lines.append(f"{row:<10}{lengths[row]:>12}{total.linear_macs / 1e9:>10.2f}{total.attention_macs / 1e9:>10.3f}"
                     f"{works[row][0].weights / 1e6:>11.1f}{len(works[row]):>8}{total.kv_reads / 1e6:>11.1f}")
    return "\n".join(lines)


def format_floors(plans: Sequence[PlanFloor]) -> str:
    """Floor ms per row and plan (c: compute-bound, m: memory-bound), then the request totals."""
    header = f"{'floor':<22}" + "".join(f"{p.name:>15}" for p in plans)
    lines = [header, "-" * len(header)]
    for row in ROWS:
        lines.append(f"{row + ' ms':<22}" + "".join(f"{p.idle[row].floor_s * 1e3:>13.1f} {p.idle[row].bound[0]}"
                                                    for p in plans))
    concurrency = plans[0].concurrency if plans else 0
    lines.append(f"{'idle request s':<22}" + "".join(f"{p.idle_s:>15.3f}" for p in plans))
    lines.append(f"{f'{concurrency} together s':<22}" + "".join(f"{p.concurrent_s:>15.3f}" for p in plans))
    lines.append(f"{f'c={concurrency} req/min':<22}" + "".join(f"{p.concurrent_rpm:>15.1f}" for p in plans))
    return "\n".join(lines)


def format_comparisons(plan: PlanFloor, comparisons: Sequence[Comparison]) -> str:
    header = f"{'measured (' + plan.name + ')':<26}{'measured':>12}{'floor':>12}{'x floor':>9}{'of roofline':>13}"
    lines = [header, "-" * len(header)]
    for c in comparisons:
        lines.append(f"{c.what:<26}{c.measured:>12.3f}{c.floor:>12.3f}{c.times_floor:>9.2f}{c.fraction:>13.0%}"
                     f"  {c.unit}")
    return "\n".join(lines)


def _mean(values: Sequence[int]) -> float:
    return statistics.mean(values) if values else 0.0
