"""This CPU's peak multiply-add rate in the instruction each of the project's product kernels multiplies
with: what a decode step's products cannot beat however their weights are read (the arithmetic floor,
profiling/lib/decode_floor.py), beside the memory floor.

Each instruction runs in a loop of 12 independent accumulators (more than its latency times its issue
rate, so nothing waits on a result) on `threads` threads at once, nothing else in the loop: the rate of
the instruction alone, an upper bound for a kernel that also loads, broadcasts and converts. The loops are
C++ built here by g++ into a plain shared library (no torch headers: built in about a second, each
process its own) and called through ctypes, each thread a std::thread (not OpenMP: torch's own OpenMP
threads spin between regions and must not share a runtime with the probe).

* ``vdpbf16ps`` (pipeline/kernels/avx512_bf16.py): 32 bfloat16 multiply-adds a zmm instruction;
* ``vpdpbusd`` (pipeline/kernels/vnni_int8.py, vnni_int4.py): 64 u8 x s8 multiply-adds a zmm instruction;
* ``vpmaddubsw`` (pipeline/kernels/avx2_int8.py, avx2_int4.py): 32 u8 x s8 multiply-adds a ymm instruction,
  with the 16-bit add that keeps its sums (the least the AVX2 kernels do per instruction).
"""
from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.cpu_features import cpu_flags

_SOURCE = r'''
#include <immintrin.h>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

constexpr int ACCUMULATORS = 12;

// Each loop returns the sum of its accumulators' lanes: the work is used (not optimized away), and a caller
// can check that `iterations` instructions per accumulator ran. The `asm` makes an operand opaque each turn,
// so the product cannot be taken out of the loop.
__attribute__((target("avx512f,avx512bf16"))) double dpbf16(int64_t iterations) {
  __m512 acc[ACCUMULATORS];
  for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;  // pairs of bfloat16 ones
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    asm volatile("" : "+v"(a));
  }
  double total = 0;
  for (int i = 0; i < ACCUMULATORS; ++i) total += _mm512_reduce_add_ps(acc[i]);
  return total;
}

__attribute__((target("avx512f,avx512vnni"))) double dpbusd(int64_t iterations) {
  __m512i acc[ACCUMULATORS];
  for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm512_setzero_si512();
  __m512i a = _mm512_set1_epi8(1), b = a;
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    asm volatile("" : "+v"(a));
  }
  double total = 0;
  for (int i = 0; i < ACCUMULATORS; ++i) total += _mm512_reduce_add_epi32(acc[i]);
  return total;
}

__attribute__((target("avx2"))) double maddubs(int64_t iterations) {
  __m256i acc[ACCUMULATORS];
  for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm256_setzero_si256();
  __m256i a = _mm256_set1_epi8(1), b = a;
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(a, b));
    asm volatile("" : "+x"(a));
  }
  double total = 0;
  alignas(32) int16_t lanes[16];
  for (int i = 0; i < ACCUMULATORS; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[i]);
    for (int l = 0; l < 16; ++l) total += lanes[l];
  }
  return total;
}

template <double (*LOOP)(int64_t)>
double on_threads(int64_t iterations, int threads) {
  std::vector<double> totals(threads);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) running.emplace_back([&, t] { totals[t] = LOOP(iterations); });
  double total = 0;
  for (int t = 0; t < threads; ++t) { running[t].join(); total += totals[t]; }
  return total;
}

}  // namespace

extern "C" {
double vdpbf16ps(int64_t iterations, int threads) { return on_threads<dpbf16>(iterations, threads); }
double vpdpbusd(int64_t iterations, int threads) { return on_threads<dpbusd>(iterations, threads); }
double vpmaddubsw(int64_t iterations, int threads) { return on_threads<maddubs>(iterations, threads); }
}
'''
ACCUMULATORS = 12


@dataclass(frozen=True)
class Instruction:
    macs: int  # multiply-adds per instruction
    flags: frozenset[str]  # /proc/cpuinfo flags it needs


INSTRUCTIONS = {
    "vdpbf16ps": Instruction(32, frozenset({"avx512f", "avx512_bf16"})),
    "vpdpbusd": Instruction(64, frozenset({"avx512f", "avx512_vnni"})),
    "vpmaddubsw": Instruction(32, frozenset({"avx2"})),
}
# The instruction each of the project's product ops (profiling/lib/engine_step.py's PRODUCT_OPS) multiplies
# with; torch's and oneDNN's products are not here (their kernel, and so their instruction, is oneDNN's choice).
PRODUCT_INSTRUCTIONS = {"bf16_linear": "vdpbf16ps", "vnni_linear": "vpdpbusd", "vnni_int4_linear": "vpdpbusd",
                        "avx2_linear": "vpmaddubsw", "avx2_int4_linear": "vpmaddubsw"}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loops, built by g++ in a temporary folder (removed once the library is loaded: the process keeps its
    mapping); None without g++."""
    compiler = shutil.which("g++")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="arithmetic_peaks-") as name:
        folder = Path(name)
        (folder / "peaks.cpp").write_text(_SOURCE)
        subprocess.run([compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-pthread", str(folder / "peaks.cpp"),
                        "-o", str(folder / "peaks.so")], check=True, capture_output=True)
        lib = ctypes.CDLL(str(folder / "peaks.so"))
    for name in INSTRUCTIONS:
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = (ctypes.c_int64, ctypes.c_int)
    return lib


def run_loop(instruction: str, iterations: int, threads: int) -> float:
    """Runs `instruction`'s loop: `iterations` instructions per accumulator on each of `threads` threads. Returns
    the sum of every accumulator's lanes: ones times ones, so the multiply-adds that ran (while no lane
    overflows: vpmaddubsw's 16-bit lanes hold 16,383 iterations)."""
    lib = library()
    if lib is None:
        raise RuntimeError("no g++: the arithmetic probes cannot be built")
    return getattr(lib, instruction)(iterations, threads)


def mac_rate(instruction: str, threads: int, seconds: float = 0.1, rounds: int = 3) -> float | None:
    """Multiply-adds a second `instruction` gives on `threads` threads, best of `rounds` runs of about `seconds`
    each; None where this CPU lacks it or nothing can build the probe."""
    spec = INSTRUCTIONS[instruction]
    if not spec.flags <= cpu_flags() or library() is None:
        return None
    iterations = 100_000
    while True:  # grow the loop until a run takes a quarter of `seconds` (the threads' start negligible beside it)
        started = time.perf_counter()
        run_loop(instruction, iterations, threads)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds / 4:
            break
        iterations *= 4
    iterations = int(iterations * seconds / elapsed) or 1
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run_loop(instruction, iterations, threads)
        best = min(best, time.perf_counter() - started)
    return iterations * ACCUMULATORS * spec.macs * threads / best


def product_rates(threads: int) -> dict[str, float]:
    """MAC/s per product op of the project's kernels whose instruction this CPU has, measured once per
    instruction at `threads` threads."""
    rates = {name: mac_rate(name, threads) for name in sorted(set(PRODUCT_INSTRUCTIONS.values()))}
    return {op: rate for op, name in PRODUCT_INSTRUCTIONS.items() if (rate := rates[name]) is not None}
