"""This CPU's measured peaks: the matmul rate of each kind the model stages run in (float32,
bfloat16, int8 via `torch._int_mm`) and the memory bandwidth, on a given number of torch threads.
What the roofline's floors divide by (profiling/lib/roofline.py)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.kernels import huge_pages

PEAK_KINDS = ("float32", "bfloat16", "int8")
CPU_FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Machine:
    """This CPU's measured peaks (FLOP/s; int8: integer ops/s) and bandwidth (bytes/s)."""
    cpu: str
    flags: tuple[str, ...]  # those of CPU_FLAGS it has
    capability: str  # torch.backends.cpu.get_cpu_capability()
    threads: int
    peaks: dict[str, float]
    read_bandwidth: float  # a large tensor summed: what reading weights needs
    copy_bandwidth: float  # read + write of a large copy, for comparison

    def describe(self) -> str:
        peaks = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in self.peaks.items())
        return (f"{self.cpu} [{', '.join(self.flags) or 'none of ' + '/'.join(CPU_FLAGS)}], torch capability "
                f"{self.capability}, {self.threads} thread(s): {peaks}; read {self.read_bandwidth / 1e9:.1f} GB/s, "
                f"copy {self.copy_bandwidth / 1e9:.1f} GB/s")


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def median_time(fn: Callable[[], object], rounds: int, warmup: int) -> float:
    """Median seconds of `rounds` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(kind: str, size: int, rounds: int, warmup: int) -> float:
    """FLOP/s of a size^3 matmul: float32 or bfloat16 `@`, int8 `torch._int_mm` (int32 sums)."""
    import torch
    generator = torch.Generator().manual_seed(0)
    if kind == "int8":
        a, b = (torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=generator) for _ in range(2))
        def run() -> object:
            return torch._int_mm(a, b)
    else:
        a, b = (torch.randn(size, size, generator=generator).to(getattr(torch, kind)) for _ in range(2))
        def run() -> object:
            return a @ b
    with torch.inference_mode():
        return 2 * size ** 3 / median_time(run, rounds, warmup)


def bandwidths(mib: int, rounds: int, warmup: int) -> tuple[float, float]:
    """(read, copy) bytes/s over a float32 tensor of `mib` MiB: a sum reads it, a copy reads and writes; both
    tensors in 2 MB pages where the kernel gives them, as the packed weights are."""
    import torch
    x = huge_pages.empty((mib * 2 ** 20 // 4,), torch.float32).fill_(1.0)
    y = huge_pages.empty(x.shape, x.dtype)
    nbytes = x.numel() * x.element_size()
    read = nbytes / median_time(x.sum, rounds, warmup)
    copy = 2 * nbytes / median_time(lambda: y.copy_(x), rounds, warmup)
    return read, copy


def measure_machine(threads: int, matmul_size: int, bandwidth_mib: int, rounds: int, warmup: int,
                    flags: frozenset[str] | None = None) -> Machine:
    """Peaks and bandwidth on `threads` torch threads (restored afterwards)."""
    import torch

    from pipeline.cpu_features import cpu_flags
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        peaks = {kind: matmul_peak(kind, matmul_size, rounds, warmup) for kind in PEAK_KINDS}
        read, copy = bandwidths(bandwidth_mib, rounds, warmup)
    finally:
        torch.set_num_threads(before)
    have = cpu_flags() if flags is None else flags
    return Machine(cpu_name(), tuple(f for f in CPU_FLAGS if f in have), torch.backends.cpu.get_cpu_capability(),
                   threads, peaks, read, copy)
