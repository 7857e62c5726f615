"""What a load run did, in numbers, tables and files: latency statistics, the sweep's
saturation point, text tables, and CSV/JSON writers (parent folders made as needed)."""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from profiling.lib.load import Group, RequestRecord
from profiling.lib.prometheus import NodeDelta

DEFAULT_KNEE_RATIO = 1.0
# A level's p95 needs at least 20 successful requests to have one observation beyond it
# (with fewer, "p95" is an interpolation towards the maximum, one slow request): below this
# the sweep still prints its verdict, marked as too small to judge.
MIN_SWEEP_SAMPLE = 20


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    """numpy's (linear) percentiles of values; NaN for each when there are none."""
    if not len(values):
        return [math.nan] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


@dataclass(frozen=True)
class LatencyStats:
    """Over successful requests only: an error's latency says how it failed, not how fast we served.
    The spread (min, p5, stdev) is last, with defaults, so the positional fields before it stay as they were."""
    count: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float
    min_s: float = math.nan
    p5_s: float = math.nan
    stdev_s: float = math.nan  # sample standard deviation (n - 1); NaN for fewer than two

    @classmethod
    def of(cls, latencies: Sequence[float]) -> "LatencyStats":
        if not latencies:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        x = np.asarray(latencies, dtype=float)
        p5, p50, p95, p99 = percentiles(x, (5, 50, 95, 99))
        stdev = float(x.std(ddof=1)) if len(x) > 1 else math.nan
        return cls(len(x), float(x.mean()), p50, p95, p99, float(x.max()), float(x.min()), p5, stdev)


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
    # Streamed runs, over successful requests: time to the first text piece and the mean gap after it.
    ttft: LatencyStats = field(default_factory=lambda: LatencyStats.of([]))
    itl: LatencyStats = field(default_factory=lambda: LatencyStats.of([]))


def _counts(kinds: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(kinds).items()))


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
        ttft=LatencyStats.of([r.ttft_s for r in ok if not math.isnan(r.ttft_s)]),
        itl=LatencyStats.of([r.itl_s for r in ok if not math.isnan(r.itl_s)]),
    )


@dataclass(frozen=True)
class Saturation:
    rule: str
    reached: bool  # False: no knee among the levels tried (go higher)
    level: int | None  # the last level before the knee
    throughput_rpm: float  # at that level
    knee_level: int | None  # the first level past it
    max_throughput_rpm: float
    max_throughput_level: int | None
    min_sample: int = MIN_SWEEP_SAMPLE
    small_levels: tuple[int, ...] = ()  # levels with fewer successful requests than min_sample

    @property
    def judgeable(self) -> bool:
        return not self.small_levels


def small_sample_warning(sat: Saturation) -> str:
    """'' when every level had enough successful requests, else why the verdict is not to be trusted."""
    if sat.judgeable:
        return ""
    return (f"too few successful requests to judge the knee at c={','.join(map(str, sat.small_levels))} "
            f"(fewer than {sat.min_sample} each: a p95 needs {sat.min_sample} to have one request beyond it); "
            f"the verdict below is tentative: rerun with --count-per-level >= {sat.min_sample}")


def saturation_rule(ratio: float) -> str:
    return (f"knee = first step a->b (in level order) where p95 grows more than {ratio:g} x as much as "
            f"throughput: p95_b/p95_a > {ratio:g} * rpm_b/rpm_a (or rpm_b is 0); saturation = level a, "
            "its throughput = the saturation throughput")


def find_saturation(levels: Sequence[int], stats: Sequence[RunStats], ratio: float = DEFAULT_KNEE_RATIO,
                    min_sample: int = MIN_SWEEP_SAMPLE) -> Saturation:
    """The knee of a closed-loop sweep.

    Why a ratio of 1 by default and not 2: in a closed loop, Little's law makes
    latency grow in proportion to the clients once throughput is flat, so with
    doubling levels (1,2,4,8) a fully saturated step has p95 x2 for throughput
    x1, which a factor of 2 never flags. Below saturation throughput grows about
    as fast as the clients and p95 little; past it, p95 outgrows throughput."""
    rpm = [s.throughput_rpm for s in stats]
    small = tuple(level for level, s in zip(levels, stats) if s.ok < min_sample)
    best = max(range(len(rpm)), key=rpm.__getitem__, default=None)
    best_rpm, best_level = (rpm[best], levels[best]) if best is not None else (0.0, None)
    for a in range(len(levels) - 1):
        b = a + 1
        p95_a, p95_b = stats[a].latency.p95_s, stats[b].latency.p95_s
        if rpm[b] <= 0 or (rpm[a] > 0 and p95_b / p95_a > ratio * rpm[b] / rpm[a]):
            return Saturation(saturation_rule(ratio), True, levels[a], rpm[a], levels[b], best_rpm, best_level,
                              min_sample, small)
    return Saturation(saturation_rule(ratio), False, best_level, best_rpm, None, best_rpm, best_level, min_sample,
                      small)


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]) -> str:
    """A header, a rule and a line per row. A column is (title, format spec such as '<14' or '>9.2f'):
    its title is aligned and padded as its values are."""
    header = "".join(format(title, re.match(r"[<>]?\d*", spec)[0]) for title, spec in columns)
    lines = ["".join(format(value, spec) for value, (_, spec) in zip(row, columns)) for row in rows]
    return "\n".join([header, "-" * len(header), *lines])


def format_stats_table(stats: Sequence[RunStats]) -> str:
    columns = [("run", "<14"), ("sent", ">6"), ("ok", ">6"), ("req/min", ">10.2f")] + \
        [(title, ">9.2f") for title in ("p50 s", "p95 s", "p99 s", "max s")] + [("lag s", ">8.2f"), ("  errors", "")]
    return text_table(columns, [(s.name, s.sent, s.ok, s.throughput_rpm, s.latency.p50_s, s.latency.p95_s,
                                 s.latency.p99_s, s.latency.max_s, s.max_send_lag_s,
                                 "  " + (", ".join(f"{k}={v}" for k, v in s.errors.items()) or "none"))
                                for s in stats])


def format_stream_table(stats: Sequence[RunStats]) -> str:
    """Streamed runs: time to first token and the inter-token gap, beside the total latency."""
    columns = [("run", "<14"), ("n", ">5"), ("TTFT p50 s", ">12.2f"), ("TTFT p95 s", ">12.2f"),
               ("ITL p50 ms", ">12.1f"), ("ITL p95 ms", ">12.1f"), ("total p50 s", ">13.2f")]
    return text_table(columns, [(s.name, s.ttft.count, s.ttft.p50_s, s.ttft.p95_s, s.itl.p50_s * 1000,
                                 s.itl.p95_s * 1000, s.latency.p50_s) for s in stats])


def format_spread_table(stats: Sequence[RunStats]) -> str:
    """Each run's latency spread: how far one figure of the table above may be trusted."""
    columns = [("run", "<14"), ("n ok", ">6")] + [(title, ">9.2f") for title in ("min s", "p5 s", "p50 s", "p95 s",
                                                                                 "max s", "stdev s")]
    return text_table(columns, [(s.name, s.latency.count, s.latency.min_s, s.latency.p5_s, s.latency.p50_s,
                                 s.latency.p95_s, s.latency.max_s, s.latency.stdev_s) for s in stats])


def format_nodes_table(nodes: Sequence[NodeDelta]) -> str:
    def mib(value: float | None) -> str:
        return f"{value / 2**20:.0f} MiB" if value else "?"
    lines = []
    for node in nodes:
        if node.error:
            lines.append(f"{node.url}: no metrics ({node.error})")
            continue
        lines.append(f"{node.url}: peak RSS {mib(node.peak_rss_bytes)}, RSS {mib(node.rss_bytes)}")
        active = [s for s in node.stages if s.batches]
        if active:
            lines.append(f"  {'stage':<11}{'batches':>8}{'items':>7}{'mean batch':>12}{'run s/batch':>13}"
                         f"{'wait s/item':>13}")
        for s in active:
            lines.append(f"  {s.stage:<11}{s.batches:>8.0f}{s.items:>7.0f}{s.mean_batch_size:>12.2f}"
                         f"{s.mean_batch_run_s:>13.4f}{s.mean_item_wait_s:>13.4f}")
    return "\n".join(lines)


RUNS_DIR = Path("runs")


def run_folder(tool: str, out: Path | str | None = None, *, now: float | None = None,
               runs_dir: Path = RUNS_DIR) -> Path:
    """Where a run writes: `out` when the user chose one, else a fresh runs/<tool>-<UTC time>/
    (made here; -2, -3... when two runs start in the same second), so no run overwrites another.
    Absolute: tools hand it to processes they start in other folders (a --compare commit's checkout)."""
    if out is not None:
        path = Path(out).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    runs_dir = runs_dir.resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = runs_dir / (f"{tool}-{stamp}" if n == 1 else f"{tool}-{stamp}-{n}")
        with contextlib.suppress(FileExistsError):
            path.mkdir()  # exist_ok=False: the folder is ours alone
            return path
    raise FileExistsError(f"{runs_dir}/{tool}-{stamp}: 999 folders already")


def jsonable(value: Any, strict: bool = True) -> Any:
    """Dataclasses, dicts, sequences and paths as plain JSON values.

    strict: NaN and infinities become null (strict JSON has none); otherwise they
    stay floats, which Python's json writes as NaN / Infinity."""
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
    """One row per dataclass (or dict) in rows, the given columns; floats rounded when float_digits is set."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            values = row if isinstance(row, dict) else dataclasses.asdict(row)
            if float_digits is not None:
                values = {k: (round(v, float_digits) if isinstance(v, float) else v) for k, v in values.items()}
            writer.writerow(values)
    return path


@dataclass
class GroupResult:
    """One phase or level of a load run: its requests, their figures, and what each node did."""
    group: Group
    records: list[RequestRecord]
    stats: RunStats
    nodes: list[NodeDelta]
