"""A decode step against its memory floor: the bytes one step must read over the bandwidth this machine
reads memory at, measured here (profiling/bench_decode.py prints every step beside it).

A decode step multiplies every Linear's whole weight once (half a GB and more does not stay in cache
from one step to the next) and reads each sequence's keys and values so far; the embedding table is
only gathered (a row per sequence), so it is not counted, nor are activations, norms and the like
(well under 1 % at one sequence). Floor = (weight bytes + KV bytes) / read bandwidth at the thread
count the step ran on: no step on this machine can be faster, whatever its kernels.

The bandwidth is a streaming read of a float32 buffer many times the last-level cache, in 2 MB pages where the
kernel gives them as the packed weights are (pipeline.kernels.huge_pages: 4 KB pages read slower), summed whole (one
stream a thread) and as eight rows (eight streams, as a product reads blocks of a weight side by side): the
fastest of a few rounds of either, at one thread and at all of torch's. A floor should not be beaten: the
median of plain sums, which this was, read 10-30 % slower than the int8 products on this shared machine
(docs/performance.md, section 19). Nor is a probe before the steps enough: a shared host's bandwidth moves
by up to 2x within minutes (products once read at 1.2x the bandwidth probed minutes before them), so a
:class:`BandwidthProbe` also reads between a benchmark's rounds of steps, and the floor takes the fastest
read of either.

A step also cannot be faster than its products' multiply-adds at the peak rate of the instruction each
kernel multiplies with (profiling/lib/arithmetic_peaks.py): at one sequence that arithmetic floor is far
below the memory's; at eight rows it reaches it on a two-core machine (eight multiply-adds per weight read).
The larger of the two is the step's bound."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.kernels import huge_pages

# What a floor table keeps of each step's result (bench_decode_floor.json).
TABLE_KEYS = ("precision", "sequences", "step_ms", "floor_gb_s", "median_gb_s", "floor_ms", "step_over_floor",
              "step_over_median_floor", "arithmetic_floor_ms", "step_over_bound", "products_ms", "weights_floor_ms",
              "products_over_floor", "products_over_bound", "outside_ms", "product_macs", "weight_mb", "kv_mb",
              "context_tokens")
# The buffer must be at least this many times the last-level cache, or the read is partly the cache's.
CACHE_MULTIPLE = 8


def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache this CPU reports (sysfs `size`, e.g. "32768K"), None where none is readable."""
    sizes = []
    for size_file in cache_dir.glob("index*/size"):
        text = size_file.read_text().strip().upper()
        unit = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def buffer_problem(buffer_bytes: int, cache_bytes: int | None) -> str | None:
    """Why a buffer of `buffer_bytes` would measure the cache rather than memory, or None where it is large enough."""
    if cache_bytes is None or buffer_bytes >= CACHE_MULTIPLE * cache_bytes:
        return None
    return (f"the bandwidth buffer ({buffer_bytes / 2 ** 20:.0f} MiB) is under {CACHE_MULTIPLE}x the last-level "
            f"cache ({cache_bytes / 2 ** 20:.0f} MiB): the read is partly the cache's")


class BandwidthProbe:
    """Read bandwidth of `device`'s memory (on the CPU at torch's thread count): a float32 buffer of `mib` MiB
    summed whole and as eight rows, one read a :meth:`sample`, the two in turn (a benchmark samples between its
    rounds: the fastest seen while its steps ran). Holds its buffer until dropped. On a GPU the buffer is in the
    device's memory, which its steps read, and each read is timed to its end (the device synchronized)."""

    def __init__(self, mib: int, device: str = "cpu"):
        import torch
        count = mib * 2 ** 20 // 4 // 8 * 8
        on_cpu = device == "cpu"
        buffer = (huge_pages.empty((count,), torch.float32) if on_cpu
                  else torch.empty((count,), dtype=torch.float32, device=device)).fill_(1.0)
        self._finish = (lambda: None) if on_cpu else partial(torch.cuda.synchronize, buffer.device)
        self.bytes = buffer.numel() * buffer.element_size()
        self._reads = (buffer.sum, lambda: buffer.view(8, -1).sum(1))
        for read in self._reads:  # untimed: the buffer's pages touched once
            read()
        self._finish()
        self.samples: list[float] = []  # seconds a read took, in order

    def sample(self) -> None:
        read = self._reads[len(self.samples) % 2]
        started = time.perf_counter()
        read()
        self._finish()
        self.samples.append(time.perf_counter() - started)

    def fastest(self) -> float | None:
        """Bytes/s of the fastest read sampled, None before any."""
        return self.bytes / min(self.samples) if self.samples else None

    def median(self) -> float | None:
        """Bytes/s of the median read sampled (the bandwidth the steps typically had), None before any."""
        import statistics
        return self.bytes / statistics.median(self.samples) if self.samples else None


def read_bandwidth(mib: int, threads: int, rounds: int = 5, device: str = "cpu") -> float:
    """Bytes/s of a streaming read of a float32 buffer of `mib` MiB in `device`'s memory on `threads` torch threads
    (torch's thread count restored): the fastest of `rounds` rounds of each read, summed whole and as eight rows,
    after one untimed read of each."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        probe = BandwidthProbe(mib, device)
        for _ in range(2 * rounds):
            probe.sample()
    finally:
        torch.set_num_threads(before)
    return probe.fastest() or 0.0  # no rounds: nothing read


def measure_bandwidths(mib: int, device: str = "cpu") -> dict[str, float]:
    """Read bandwidth (bytes/s) at one thread, torch's thread count (a step's) and every core, keyed by the
    count, and on a GPU `device` its memory's too, keyed by :func:`bandwidth_key`; warns where a buffer of `mib`
    MiB is too small to leave the CPU's cache."""
    import torch
    problem = buffer_problem(mib * 2 ** 20, last_level_cache_bytes())
    if problem:
        print(f"WARNING: {problem}; raise --bandwidth-mib", flush=True)
    counts = sorted({1, torch.get_num_threads(), os.cpu_count() or 1})
    found = {str(n): read_bandwidth(mib, n) for n in counts}
    if device != "cpu":
        found[device] = read_bandwidth(mib, torch.get_num_threads(), device=device)
    return found


def format_bandwidths(bandwidths: Mapping[str, float]) -> str:
    """:func:`measure_bandwidths`' reads in words: "15.3 GB/s at 1 thread(s), ..., 4119.3 GB/s on cuda"."""
    return ", ".join(f"{v / 1e9:.1f} GB/s " + (f"at {k} thread(s)" if k.isdigit() else f"on {k}")
                     for k, v in bandwidths.items())


def bandwidth_key(device: str) -> str:
    """The key of :func:`measure_bandwidths` that a step on `device` reads at: the GPU's, or the CPU's at torch's
    thread count."""
    import torch
    return device if device != "cpu" else str(torch.get_num_threads())


def weight_bytes(model: Any) -> int:
    """The bytes a forward reads in full: every module's own parameters and buffers but the embedding
    tables' (gathered a row at a time), and fbgemm's packed int8 weights (outside buffers())."""
    import torch
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        total += sum(t.numel() * t.element_size() for t in own)
        packed = getattr(module, "packed_nbytes", None)
        total += packed() if callable(packed) else 0
    return total


def kv_bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes of one token's keys and values over every layer (a Qwen2-style config: grouped-query heads)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element_size


@dataclass(frozen=True)
class StepFloor:
    """One decode step's least time on this machine."""
    weight_bytes: int
    kv_bytes: int  # every sequence's keys and values so far
    bandwidth: float  # bytes/s, at the step's thread count

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def floor_s(self) -> float:
        return self.bytes / self.bandwidth

    def times_floor(self, step_s: float) -> float:
        """How many floors a measured step is (1.0: at the floor)."""
        return step_s / self.floor_s


def step_floor(weights: int, context_lengths: Iterable[int], kv_per_token: int, bandwidth: float) -> StepFloor:
    """The floor of a step of the sequences whose contexts (keys each reads) are `context_lengths`."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    return StepFloor(weights, sum(context_lengths) * kv_per_token, bandwidth)


def arithmetic_floor_ms(macs: Mapping[str, int] | None, rates: Mapping[str, float]) -> float | None:
    """ms a step's products take at least for their multiply-adds alone: each product op's `macs` over its
    instruction's peak rate (profiling/lib/arithmetic_peaks.py's product_rates); None where an op's rate is
    unknown (torch's and oneDNN's products) or the products were not counted."""
    if not macs or any(op not in rates for op in macs):
        return None
    return 1e3 * sum(count / rates[op] for op, count in macs.items())


def floor_fields(floor: StepFloor, step_ms: float, products_ms: float | None,
                 arithmetic_ms: float | None = None) -> dict[str, float | None]:
    """A result row's floor columns: MB read, the step's floor in ms and its multiple of it; the step's
    products (`products_ms`, replayed alone; None where not timed) against the weights' floor alone, and the
    step outside them; the arithmetic floor (`arithmetic_ms`, :func:`arithmetic_floor_ms`) and the step and its
    products against the larger of it and the memory's floor (the bound: None without an arithmetic floor)."""
    weights_floor_ms = 1e3 * floor.weight_bytes / floor.bandwidth
    bound = None if arithmetic_ms is None else max(1e3 * floor.floor_s, arithmetic_ms)
    products_bound = None if arithmetic_ms is None else max(weights_floor_ms, arithmetic_ms)
    return {"weight_mb": round(floor.weight_bytes / 1e6, 1), "kv_mb": round(floor.kv_bytes / 1e6, 2),
            # four significant figures: a tiny model's floor is hundredths of a millisecond
            "floor_ms": float(f"{1e3 * floor.floor_s:.4g}"), "step_over_floor": round(floor.times_floor(step_ms / 1e3), 2),
            "weights_floor_ms": float(f"{weights_floor_ms:.4g}"),
            "products_over_floor": None if products_ms is None else float(f"{products_ms / weights_floor_ms:.3g}"),
            "outside_ms": None if products_ms is None else round(step_ms - products_ms, 2),
            "arithmetic_floor_ms": None if arithmetic_ms is None else float(f"{arithmetic_ms:.4g}"),
            "step_over_bound": None if bound is None else round(step_ms / bound, 2),
            "products_over_bound": None if products_bound is None or products_ms is None
            else float(f"{products_ms / products_bound:.3g}")}


def format_floor_rows(rows: Sequence[dict]) -> str:
    """precision, sequences, step ms, the bandwidth its floor is read at, floor ms, step / floor, step / the floor
    at the median read between its rounds (where given), the arithmetic floor and step / the larger floor
    (where known); products ms, their floor (the weights'), their multiple of it, the step outside them
    ("-" where the products were not timed); MB read (weights + KV); one line per row."""
    def cell(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    header = (f"{'precision':<14}{'seqs':>5}{'step ms':>10}{'GB/s':>7}{'floor ms':>10}{'x floor':>9}{'x median':>10}"
              f"{'arith ms':>10}{'x bound':>9}{'products ms':>13}"
              f"{'weights floor':>15}{'x floor':>9}{'outside ms':>12}{'weights MB':>12}{'KV MB':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['precision']:<14}{r['sequences']:>5}{r['step_ms']:>10.1f}{cell(r.get('floor_gb_s'), 7, 1)}"
                     f"{r['floor_ms']:>10.2f}{r['step_over_floor']:>9.2f}{cell(r.get('step_over_median_floor'), 10, 2)}"
                     f"{cell(r.get('arithmetic_floor_ms'), 10, 2)}{cell(r.get('step_over_bound'), 9, 2)}"
                     f"{cell(r['products_ms'], 13, 1)}{r['weights_floor_ms']:>15.2f}{cell(r['products_over_floor'], 9, 2)}"
                     f"{cell(r['outside_ms'], 12, 1)}{r['weight_mb']:>12.1f}{r['kv_mb']:>8.2f}")
    return "\n".join(lines)


def add_floors(rows: list[dict], model: Any, bandwidth: float, rates: Mapping[str, float] | None = None) -> None:
    """Each result row's floor columns (:func:`floor_fields`), from `model`'s weight bytes and its KV width, and
    where `rates` (MAC/s per product op) are given the arithmetic floor of the row's product_macs; a row holds
    step_ms, products_ms and context_tokens (every sequence's keys)."""
    weights = weight_bytes(model)
    element = next(model.parameters()).element_size()  # the KV cache is kept in the model's dtype
    per_token = kv_bytes_per_token(model.config, element)
    for row in rows:
        floor = step_floor(weights, [row["context_tokens"]], per_token, bandwidth)
        arithmetic = arithmetic_floor_ms(row.get("product_macs"), rates or {})
        row.update(floor_fields(floor, row["step_ms"], row["products_ms"], arithmetic))
