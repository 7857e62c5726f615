"""Small PNG plots for the profiling tools (matplotlib's Agg backend: no display needed)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: the tools run headless, on servers and in tests
import matplotlib.pyplot as plt  # noqa: E402

from profiling.lib.report import GroupResult, Saturation  # noqa: E402

# Small files on purpose: they are glanced at and attached to notes, not printed.
FIGSIZE = (9, 3.4)
DPI = 80


def microbench_plot(path: Path, rows: Sequence) -> Path:
    """One stage's microbench rows: per-item time (median with min-max bars) and throughput against batch size."""
    first, sizes = rows[0], [r.batch_size for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE)
    median = [r.item_s_median * 1e3 for r in rows]
    spread = [[m - r.item_s_min * 1e3 for m, r in zip(median, rows)],
              [r.item_s_max * 1e3 - m for m, r in zip(median, rows)]]
    left.errorbar(sizes, median, yerr=spread, marker="o", capsize=3)
    left.set(xlabel="batch size", ylabel="ms per item", title=f"{first.stage}: time per item")
    right.plot(sizes, [r.items_per_s for r in rows], marker="o", color="tab:green")
    right.set(xlabel="batch size", ylabel="items / s", title=f"{first.stage}: throughput")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{first.model_source} {first.device}/{first.dtype} threads={first.threads} repeat={first.repeat} "
                 f"{first.detail}", fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)  # figures are kept by pyplot until closed; sweeps make several
    return path


def write_plots(out: Path, name: str, results: Sequence[GroupResult], saturation: Saturation | None) -> list[Path]:
    """A load run's plots: the latency of every request against its send time, one colour per phase or
    level, errors as x (no reply: drawn at 0); for a sweep, throughput against p95 with the saturation marked."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    sent = [r for res in results for r in res.records if not math.isnan(r.send_s)]
    for group in dict.fromkeys(r.group for r in sent):
        good = [r for r in sent if r.group == group and r.ok and r.finished]
        ax.scatter([r.send_s for r in good], [r.latency_s for r in good], s=12, label=group or "requests")
    bad = [r for r in sent if not (r.ok and r.finished)]
    if bad:
        ax.scatter([r.send_s for r in bad], [0.0 if math.isnan(r.latency_s) else r.latency_s for r in bad], marker="x",
                   color="red", s=24, label="errors")
    ax.set(xlabel="send time (s from start)", ylabel="latency (s)", title=f"{name}: latency of each request")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    paths = [_save(fig, out / f"loadgen_{name}_latency.png")]
    if saturation is None:
        return paths
    fig, ax = plt.subplots(figsize=FIGSIZE)
    rpm, p95 = [r.stats.throughput_rpm for r in results], [r.stats.latency.p95_s for r in results]
    ax.plot(rpm, p95, marker="o")
    for result, x, y in zip(results, rpm, p95):
        level = result.group.concurrency  # a sweep's groups are closed
        ax.annotate(f"c={level}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if saturation.reached and level == saturation.level:
            ax.scatter([x], [y], s=120, facecolors="none", edgecolors="red", label=f"saturation (c={level})")
    ax.set(xlabel="throughput (requests / min)", ylabel="p95 latency (s)",
           title="concurrency sweep: throughput vs p95 latency")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if saturation.reached:
        ax.legend(fontsize=7)
    return paths + [_save(fig, out / f"loadgen_{name}_sweep.png")]


def index_bench_plot(path: Path, rows: Sequence[dict]) -> Path:
    """profiling.index_bench: recall@10 against search time (the largest batch, p50) and against bytes on disk, one
    colour per index kind, each point one nprobe / efSearch."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE)
    batch = max(int(key[len("p50_ms_b"):]) for key in rows[0] if key.startswith("p50_ms_b"))  # the largest timed
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = [r for r in rows if r["spec"] == spec]
        left.plot([r[f"p50_ms_b{batch}"] for r in mine], [r["recall"] for r in mine], marker="o", label=spec)
        right.scatter([r["disk_mb"] for r in mine], [r["recall"] for r in mine], label=spec)
    left.set(xlabel=f"search ms, batch of {batch} (p50)", ylabel="recall@10", title="recall against search time")
    right.set(xlabel="index MB on disk", ylabel="recall@10", title="recall against size")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    return _save(fig, path)


def design_scale_plot(path: Path, rows: Sequence[dict], floor: float) -> Path:
    """profiling.design_scale: recall@10 against p50 search time, one colour per index kind and one marker per
    batch size, each point one nprobe (the floor dashed); and each kind's bytes on disk and resident in the node
    after its searches (all, and anonymous: the node's own heap)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE)
    kinds = list(dict.fromkeys(r["spec"] for r in rows))
    colours = {spec: f"C{i}" for i, spec in enumerate(kinds)}
    batches = sorted({int(key[1:]) for r in rows for key in r["latency"]})
    for spec in kinds:
        mine = sorted((r for r in rows if r["spec"] == spec), key=lambda r: r["nprobe"])
        for batch, marker in zip(batches, "os^vDP*X"):
            left.plot([r["latency"][f"b{batch}"]["p50_ms"] for r in mine], [r["recall"] for r in mine],
                      marker=marker, color=colours[spec], label=f"{spec}, batch {batch}")
        for r in mine:  # each point's nprobe, beside its largest batch's
            left.annotate(str(r["nprobe"]), (r["latency"][f"b{batches[-1]}"]["p50_ms"], r["recall"]),
                          textcoords="offset points", xytext=(4, -8), fontsize=6)
    left.axhline(floor, color="grey", linestyle="--", linewidth=1)
    left.set_xscale("log")
    left.set(xlabel="search ms through the node (p50)", ylabel="recall@10",
             title=f"recall against latency (floor {floor:g} dashed)")
    left.legend(fontsize=6)
    width = 0.27
    for offset, (label, value) in enumerate((
            ("on disk", lambda mine: mine[0]["disk_bytes"]),
            ("resident after searches", lambda mine: max(r["memory_serving"].get("rss", 0) for r in mine)),
            ("of which anonymous", lambda mine: max(r["memory_serving"].get("anon", 0) for r in mine)))):
        heights = [value([r for r in rows if r["spec"] == spec]) / 1e9 for spec in kinds]
        right.bar([i + (offset - 1) * width for i in range(len(kinds))], heights, width, label=label)
    right.set_xticks(range(len(kinds)), kinds, fontsize=7)
    right.set(ylabel="GB", title="index bytes: disk and node memory")
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return _save(fig, path)
