"""What this CPU can do, read from /proc/cpuinfo's flags (no torch, no other pipeline module), and the
instruction set oneDNN is held to.

oneDNN picks its kernel for a product by the row count, and on a CPU with AMX it picks AMX tiles once
the rows are many enough (between 17 and 64 for Qwen2.5-0.5B's and bert-base's Linears): that kernel
sums a row another way than the one a lone row gets, so a request's bits would depend on its
batch-mates. Below AMX (AVX2, AVX-512, AVX-512 with bf16) oneDNN's matmul gives a row the same bits at
every row count from 2 up, on every kind checked (tests/unit/test_kernels_per_isa.py runs the
invariance tests once per instruction set the machine has). So on a CPU with AMX the process holds
oneDNN at ROW_INVARIANT_ONEDNN_ISA: the same kernels an AMD EPYC with avx512_bf16 runs, at the cost
of AMX's arithmetic (int8 included, which would have been exact on AMX too; the hold is one
process-wide setting). Asked about this machine, the flag tests below answer for the instruction set
oneDNN is held to; given flags, for a machine that has them.

oneDNN reads ONEDNN_MAX_CPU_ISA once, at its first kernel, so :func:`hold_onednn_below_amx` runs when
the pipeline package is imported, before any model is built.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "amx_tile"})
AMX_CPU_FLAGS = frozenset({"amx_bf16", "amx_tile"})  # both: AMX's bf16 matrix tiles
# int8 x int8 summed in 32 bits at once; without these fbgemm's and oneDNN's 16-bit pair sums saturate.
VNNI_CPU_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})
# The project's AVX2 int8 kernel (pipeline.kernels.avx2_int8) sums exactly without VNNI: |w| x signed code pairs
# never reach the 16-bit limit.
EXACT_INT8_CPU_FLAGS = VNNI_CPU_FLAGS | {"avx2"}
# oneDNN packs a bfloat16 weight (what a row-invariant bfloat16 Linear multiplies) only with these
# (torch's mkldnn_reorder_linear_weight: "avx_ne_convert or avx512bw, avx512vl and avx512dq").
BF16_PACKING_CPU_FLAGS = frozenset({"avx512bw", "avx512vl", "avx512dq"})
# torch's packed int4 product (pipeline.kernels.int4) has AVX2 and AVX-512 kernels; without AVX2 and FMA
# it runs a scalar loop, far slower than any other variant.
INT4_CPU_FLAGS = frozenset({"avx2", "fma"})

# oneDNN's instruction-set levels (its ONEDNN_MAX_CPU_ISA values), lowest first, each with the CPU
# flags it adds to the one before; a level's aliases share its flags.
ONEDNN_ISA_LADDER: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = (
    (("SSE41",), frozenset({"sse4_1"})),
    (("AVX",), frozenset({"avx"})),
    (("AVX2",), frozenset({"avx2", "fma"})),
    (("AVX2_VNNI",), frozenset({"avx_vnni"})),
    (("AVX2_VNNI_2",), frozenset({"avx_vnni_int8", "avx_ne_convert"})),
    (("AVX512_CORE",), frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
    (("AVX512_CORE_VNNI",), frozenset({"avx512_vnni"})),
    (("AVX512_CORE_BF16",), frozenset({"avx512_bf16"})),
    (("AVX512_CORE_FP16", "AVX10_1_512"), frozenset({"avx512_fp16"})),
    (("AVX512_CORE_AMX", "AVX10_1_512_AMX"), frozenset({"amx_tile", "amx_bf16", "amx_int8"})),
    (("AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16"), frozenset({"amx_fp16"})),
)
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN reads the first one set
# The highest level whose float products give a row the same bits at any row count (module docstring).
ROW_INVARIANT_ONEDNN_ISA = "AVX512_CORE_BF16"
# The levels the invariance tests run at, where the CPU has them: the kinds seen (AVX2 only; AVX-512
# without bf16; avx512_bf16, which AMX CPUs are held to).
CHECKED_ONEDNN_ISAS = ("AVX2", "AVX512_CORE", "AVX512_CORE_BF16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's own flags, whatever oneDNN is held to."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _own(flags: Iterable[str] | None) -> frozenset[str]:
    """The flags given (a machine described), else the CPU's own, whatever oneDNN is held to."""
    return cpu_flags() if flags is None else frozenset(flags)


def _level(name: str) -> int | None:
    """The ladder index of a level name (any case), None where oneDNN has no such level."""
    return next((i for i, (names, _) in enumerate(ONEDNN_ISA_LADDER) if name.strip().upper() in names), None)


def _flags_above(level: int) -> frozenset[str]:
    """The flags the ladder's levels above `level` add."""
    return frozenset().union(*(added for _, added in ONEDNN_ISA_LADDER[level + 1:]))


def onednn_isa_held(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(variable, value) of the ISA hold oneDNN reads, or None where neither variable is set."""
    return next(((v, environ[v]) for v in ONEDNN_ISA_VARIABLES if environ.get(v)), None)


def onednn_flags(flags: Iterable[str] | None = None, environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The CPU's flags less those of the levels above oneDNN's hold (all of them where nothing is held
    or the value names no level: oneDNN then ignores it)."""
    have = _own(flags)
    held = onednn_isa_held(environ)
    level = None if held is None else _level(held[1])
    return have if level is None else have - _flags_above(level)


def _given_or_here(flags: Iterable[str] | None) -> frozenset[str]:
    """The flags given (a machine described), else this process's: the CPU's under oneDNN's hold."""
    return onednn_flags() if flags is None else frozenset(flags)


def cpu_supports_bf16(flags: Iterable[str] | None = None) -> bool:
    return bool(BF16_CPU_FLAGS & _given_or_here(flags))


def cpu_packs_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether oneDNN can pack a bfloat16 weight here (under its hold, asked about this machine)."""
    have = _given_or_here(flags)
    return BF16_PACKING_CPU_FLAGS <= have or "avx_ne_convert" in have


def cpu_sums_int8_exactly(flags: Iterable[str] | None = None) -> bool:
    """Whether an int8 kernel can sum exactly here: the CPU has VNNI (fbgemm, the project's VNNI kernel) or
    AVX2 (the project's AVX2 kernel, built by setup), by its own flags (fbgemm does not follow oneDNN's hold).
    pipeline.kernels.int8 checks the kernels themselves at load."""
    return bool(EXACT_INT8_CPU_FLAGS & _own(flags))


def cpu_runs_int4(flags: Iterable[str] | None = None) -> bool:
    """Whether torch's packed int4 product has a vector kernel here (the CPU's own flags: it is ATen's
    kernel, not oneDNN's)."""
    return INT4_CPU_FLAGS <= _own(flags)


def onednn_isas_here(flags: Iterable[str] | None = None) -> list[str]:
    """The levels of CHECKED_ONEDNN_ISAS this CPU has every flag of (its own flags, not the hold's)."""
    have = _own(flags)
    needed: frozenset[str] = frozenset()
    found = []
    for names, added in ONEDNN_ISA_LADDER[2:]:  # from AVX2 up, the levels checked and those between them
        if names[0].startswith("AVX2_"):
            continue  # AVX2's VNNI levels: later than AVX-512 on Intel, absent on AMD; not on the way up
        needed |= added
        if names[0] in CHECKED_ONEDNN_ISAS and needed <= have:
            found.append(names[0])
        if names[0] == CHECKED_ONEDNN_ISAS[-1]:
            return found
    return found


def onednn_checked_level(flags: Iterable[str] | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The level of CHECKED_ONEDNN_ISAS this process's oneDNN runs at: the hold's, else the highest the CPU
    has where it has nothing above it; None where it runs at another level."""
    held = onednn_isa_held(environ)
    if held is not None:
        name = held[1].strip().upper()
        return name if name in CHECKED_ONEDNN_ISAS else None
    have = _own(flags)
    here = onednn_isas_here(have)
    return here[-1] if here and not have & _flags_above(_CHECKED_TOP) else None


# Their places on the ladder (both are names of it).
_ROW_INVARIANT_LEVEL = next(i for i, (names, _) in enumerate(ONEDNN_ISA_LADDER) if ROW_INVARIANT_ONEDNN_ISA in names)
_CHECKED_TOP = next(i for i, (names, _) in enumerate(ONEDNN_ISA_LADDER) if CHECKED_ONEDNN_ISAS[-1] in names)


def hold_onednn_below_amx(environ: MutableMapping[str, str] = os.environ, flags: Iterable[str] | None = None) -> None:
    """On a CPU with AMX, hold oneDNN at ROW_INVARIANT_ONEDNN_ISA, unless the environment holds it already
    (a hold at AMX is refused where models load: :func:`onednn_isa_problem`)."""
    if AMX_CPU_FLAGS <= _own(flags) and onednn_isa_held(environ) is None:
        environ[ONEDNN_ISA_VARIABLES[0]] = ROW_INVARIANT_ONEDNN_ISA


def onednn_isa_problem(environ: Mapping[str, str] = os.environ, flags: Iterable[str] | None = None) -> str | None:
    """Why oneDNN may run AMX kernels here (one line naming the variable), or None where it cannot."""
    if not AMX_CPU_FLAGS <= _own(flags):
        return None
    held = onednn_isa_held(environ)
    if held is None:
        return (f"{ONEDNN_ISA_VARIABLES[0]} is not set on this CPU with AMX: oneDNN's AMX kernels sum a row by its "
                f"batch-mates' count; import pipeline before torch runs, or set it to {ROW_INVARIANT_ONEDNN_ISA}")
    variable, value = held
    level = _level(value)
    if level is None or level > _ROW_INVARIANT_LEVEL:
        why = "names no oneDNN level, so oneDNN ignores it and runs AMX" if level is None else "lets oneDNN run AMX"
        return (f"{variable}={value} {why}, whose kernels sum a row by its batch-mates' count: "
                f"set it to {ROW_INVARIANT_ONEDNN_ISA} or lower, or unset it")
    return None
