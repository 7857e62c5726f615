"""What this CPU can do, read from /proc/cpuinfo's flags (no torch, no other pipeline module)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "amx_tile"})
AMX_CPU_FLAGS = frozenset({"amx_bf16", "amx_tile"})  # both: AMX's bf16 matrix tiles
AMX_INT8_CPU_FLAGS = frozenset({"amx_int8", "amx_tile"})  # both: AMX's int8 matrix tiles


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_supports_bf16(flags: Iterable[str] | None = None) -> bool:
    return bool(BF16_CPU_FLAGS & set(cpu_flags() if flags is None else flags))


def cpu_has_amx(flags: Iterable[str] | None = None) -> bool:
    return AMX_CPU_FLAGS <= set(cpu_flags() if flags is None else flags)


def cpu_has_amx_int8(flags: Iterable[str] | None = None) -> bool:
    return AMX_INT8_CPU_FLAGS <= set(cpu_flags() if flags is None else flags)
