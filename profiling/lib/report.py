"""What a load run did, in numbers, tables and files: latency statistics, the sweep's
saturation point, text tables, and CSV/JSON writers (parent folders made as needed)."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from profiling.lib.load import RequestRecord
from profiling.lib.prometheus import NodeDelta

DEFAULT_KNEE_RATIO = 1.0


# ------------------------------------------------------------------------- statistics

def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    """numpy's (linear) percentiles of values; NaN for each when there are none."""
    if not len(values):
        return [math.nan] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


@dataclass(frozen=True)
class LatencyStats:
    """Over successful requests only: an error's latency says how it failed, not how fast we served."""
    count: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float

    @classmethod
    def of(cls, latencies: Sequence[float]) -> "LatencyStats":
        if not latencies:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        x = np.asarray(latencies, dtype=float)
        p50, p95, p99 = percentiles(x)
        return cls(len(x), float(x.mean()), p50, p95, p99, float(x.max()))


@dataclass(frozen=True)
class RunStats:
    name: str
    planned: int
    sent: int
    ok: int
    errors: dict[str, int]
    duration_s: float  # first send to last reply
    throughput_rpm: float  # successful requests per minute over duration_s
    latency: LatencyStats
    max_send_lag_s: float  # open loop: how late the worst send left (a busy load generator shows here)
    served_by: dict[str, int]


def _counts(kinds: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def run_stats(name: str, planned: int, records: Sequence[RequestRecord]) -> RunStats:
    sent = [r for r in records if not math.isnan(r.send_s)]
    finished = [r for r in sent if r.finished]
    ok = [r for r in finished if r.ok]
    errors = _counts(kind for r in sent if (kind := r.error if r.finished else "no_reply_by_deadline"))
    duration = (max(r.done_s for r in finished) - min(r.send_s for r in sent)) if finished else 0.0
    return RunStats(
        name=name, planned=planned, sent=len(sent), ok=len(ok), errors=errors,
        duration_s=duration, throughput_rpm=60.0 * len(ok) / duration if duration > 0 else 0.0,
        latency=LatencyStats.of([r.latency_s for r in ok]),
        max_send_lag_s=max((r.send_s - r.scheduled_s for r in sent), default=0.0),
        served_by=_counts(r.served_by or "?" for r in ok),
    )


# ------------------------------------------------------------------------- saturation (sweep)

@dataclass(frozen=True)
class Saturation:
    rule: str
    reached: bool  # False: no knee among the levels tried (go higher)
    level: int | None  # the last level before the knee
    throughput_rpm: float  # at that level
    knee_level: int | None  # the first level past it
    max_throughput_rpm: float
    max_throughput_level: int | None


def saturation_rule(ratio: float) -> str:
    return (f"knee = first step a->b (in level order) where p95 grows more than {ratio:g} x as much as "
            f"throughput: p95_b/p95_a > {ratio:g} * rpm_b/rpm_a (or rpm_b is 0); saturation = level a, "
            "its throughput = the saturation throughput")


def find_saturation(levels: Sequence[int], stats: Sequence[RunStats], ratio: float = DEFAULT_KNEE_RATIO) -> Saturation:
    """The knee of a closed-loop sweep.

    Why a ratio of 1 by default and not 2: in a closed loop, Little's law makes
    latency grow in proportion to the clients once throughput is flat, so with
    doubling levels (1,2,4,8) a fully saturated step has p95 x2 for throughput
    x1, which a factor of 2 never flags. Below saturation throughput grows about
    as fast as the clients and p95 little; past it, p95 outgrows throughput.
    """
    rpm = [s.throughput_rpm for s in stats]
    best = max(range(len(rpm)), key=rpm.__getitem__, default=None)
    best_rpm, best_level = (rpm[best], levels[best]) if best is not None else (0.0, None)
    for a in range(len(levels) - 1):
        b = a + 1
        p95_a, p95_b = stats[a].latency.p95_s, stats[b].latency.p95_s
        if rpm[b] <= 0 or (rpm[a] > 0 and p95_b / p95_a > ratio * rpm[b] / rpm[a]):
            return Saturation(saturation_rule(ratio), True, levels[a], rpm[a], levels[b], best_rpm, best_level)
    return Saturation(saturation_rule(ratio), False, best_level, best_rpm, None, best_rpm, best_level)


# ------------------------------------------------------------------------- tables

def format_stats_table(stats: Sequence[RunStats]) -> str:
    header = (f"{'run':<14}{'sent':>6}{'ok':>6}{'req/min':>10}{'p50 s':>9}{'p95 s':>9}{'p99 s':>9}{'max s':>9}"
              f"{'lag s':>8}  errors")
    lines = [header, "-" * len(header)]
    for s in stats:
        lat = s.latency
        errors = ", ".join(f"{k}={v}" for k, v in s.errors.items()) or "none"
        lines.append(f"{s.name:<14}{s.sent:>6}{s.ok:>6}{s.throughput_rpm:>10.2f}{lat.p50_s:>9.2f}{lat.p95_s:>9.2f}"
                     f"{lat.p99_s:>9.2f}{lat.max_s:>9.2f}{s.max_send_lag_s:>8.2f}  {errors}")
    return "\n".join(lines)


def mib(value: float | None) -> str:
    """Bytes as whole MiB, '?' when unknown."""
    return f"{value / 2**20:.0f}" if value else "?"


def format_nodes_table(nodes: Sequence[NodeDelta]) -> str:
    lines = []
    for node in nodes:
        if node.error:
            lines.append(f"{node.url}: no metrics ({node.error})")
            continue
        peak = f"{mib(node.peak_rss_bytes)} MiB" if node.peak_rss_bytes else "?"
        rss = f"{mib(node.rss_bytes)} MiB" if node.rss_bytes else "?"
        lines.append(f"{node.url}: peak RSS {peak}, RSS {rss}")
        active = [s for s in node.stages if s.batches]
        if active:
            lines.append(f"  {'stage':<11}{'batches':>8}{'items':>7}{'mean batch':>12}{'run s/batch':>13}{'wait s/item':>13}")
        for s in active:
            lines.append(f"  {s.stage:<11}{s.batches:>8.0f}{s.items:>7.0f}{s.mean_batch_size:>12.2f}"
                         f"{s.mean_batch_run_s:>13.4f}{s.mean_item_wait_s:>13.4f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- files

def jsonable(value: Any, strict: bool = True) -> Any:
    """Dataclasses, dicts, sequences and paths as plain JSON values.

    strict: NaN and infinities become null (strict JSON has none); otherwise they
    stay floats, which Python's json writes as NaN / Infinity.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), strict) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v, strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, strict) for v in value]
    if isinstance(value, Path):
        return str(value)
    if strict and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Any, strict: bool = False) -> Path:
    """data (see jsonable) as indented JSON at path, its folder made if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(data, strict), indent=2) + "\n")
    return path


def write_csv(path: Path, rows: Sequence[Any], columns: Sequence[str], float_digits: int | None = None) -> Path:
    """One row per dataclass in rows, the given columns; floats rounded when float_digits is set."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            values = dataclasses.asdict(row)
            if float_digits is not None:
                values = {k: (round(v, float_digits) if isinstance(v, float) else v) for k, v in values.items()}
            writer.writerow(values)
    return path
