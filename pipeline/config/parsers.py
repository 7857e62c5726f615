"""Parsers of environment strings: each takes the raw text and returns the value, or raises
ValueError whose text says what is accepted (the settings put it in the operator's message)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

# What a model stage computes in (pipeline/precision_policy.py): a variant by name, or a policy
# that picks one per stage from the hardware: auto = bfloat16 where the CPU or GPU has it, else
# float32 (float16 on a GPU without bf16); fast = the per-hardware table FAST.
PRECISION_POLICIES = ("auto", "fast")
PRECISION_VARIANTS = ("float32", "bfloat16", "int8-dynamic", "int8-weight", "int4-dynamic", "int4-weight")  # the CPU's (CUDA: bfloat16 of these)
CUDA_ONLY_VARIANTS = ("float16",)  # several times slower than float32 on a CPU: refused there
PRECISION_CHOICES = PRECISION_POLICIES + PRECISION_VARIANTS[:2] + CUDA_ONLY_VARIANTS + PRECISION_VARIANTS[2:]
# A value no longer accepted -> what to set instead (the old name would otherwise be refused
# without saying what replaced it).
REMOVED_PRECISION_VALUES = {"exact": "auto (what exact computed: bfloat16 on a CPU with avx512_bf16 or AMX, "
                                     "else float32) or float32"}


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


N = TypeVar("N", int, float)


def _number(raw: str, what: str, accepted: Callable[[Any], bool], kind: Callable[[str], N]) -> N:
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(what) from None
    if not accepted(value):  # nan fails every comparison
        raise ValueError(what)
    return value


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    return lambda raw: _number(raw, f"an integer from {lo} to {hi}", lambda value: lo <= value <= hi, int)


def optional(parse: Callable[[str], Any], empty: Any = None) -> Callable[[str], Any]:
    """`parse`, where an empty (or blank) value means `empty`."""
    return lambda raw: parse(raw) if raw.strip() else empty


def positive_float(raw: str) -> float:
    return _number(raw, "a number > 0", lambda value: 0 < value < math.inf, float)


def non_negative_float(raw: str) -> float:
    return _number(raw, "a number >= 0", lambda value: 0 <= value < math.inf, float)


def float_range(lo: float, hi: float) -> Callable[[str], float]:
    return lambda raw: _number(raw, f"a number from {lo:g} to {hi:g}", lambda value: lo <= value <= hi, float)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("true or false (also 1/0, yes/no, on/off)")


def choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        lowered = raw.strip().lower()
        if lowered not in options:
            raise ValueError("one of " + ", ".join(options))
        return lowered
    return parse


def precision(raw: str) -> str:
    replacement = REMOVED_PRECISION_VALUES.get(raw.strip().lower())
    if replacement:
        raise ValueError(f"one of {', '.join(PRECISION_CHOICES)}; {raw.strip()!r} was removed: use {replacement}")
    return choice(*PRECISION_CHOICES)(raw)


def address(raw: str) -> Address:
    what = "host:port with a port from 1 to 65535 (for example 10.0.0.5:8000)"
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(what)
    return Address(host.strip("[]"), int(port))


def address_list(raw: str) -> tuple[Address, ...]:
    """Comma-separated host:port values, at least one."""
    parts = [part for part in raw.split(",") if part.strip()]
    if not parts:
        raise ValueError("a comma-separated list of host:port (for example rag-index-shard-0:8000)")
    return tuple(address(part) for part in parts)


def path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("a file system path")
    value = Path(raw.strip()).expanduser()
    return value if value.is_absolute() else (Path.cwd() / value)


def node_list(raw: str) -> tuple[int, ...]:
    what = "a comma-separated list of distinct node numbers, for example 0,1"
    try:
        nodes = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ValueError(what) from None
    if not nodes or len(set(nodes)) != len(nodes) or min(nodes) < 0:
        raise ValueError(what)
    return nodes


# The most nodes a cluster may have (node numbers 0 .. MAX_NODES - 1).
MAX_NODES = 64


def optional_host(raw: str) -> str:
    """A host name or address to listen on (no port), or "" when empty."""
    value = raw.strip().strip("[]")
    if value and (any(c.isspace() or c in "/@" for c in value) or ":" in value and value.count(":") < 2):
        raise ValueError("a host name or IP address without a port (for example 0.0.0.0), or empty")
    return value


def text(raw: str) -> str:
    return raw


HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def model_name(raw: str) -> str:
    """A Hugging Face repo id (owner/name), or a folder that exists (made absolute)."""
    value = raw.strip()
    folder = Path(value).expanduser()
    if value and folder.is_dir():
        return str(folder.resolve())
    if value.startswith(("/", ".", "~")) or not HUB_REPO_ID.fullmatch(value):
        raise ValueError("a Hugging Face repo id (owner/name) or an existing folder holding a sentence-transformers model")
    return value


def origin_list(raw: str) -> tuple[str, ...]:
    """Comma-separated web origins (scheme://host[:port]) or *; empty: none."""
    origins = tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    for origin in origins:
        if origin != "*" and (not origin.startswith(("http://", "https://")) or "/" in origin.split("://", 1)[1]):
            raise ValueError("comma-separated origins such as https://app.example.com, or *")
    return origins


def token(raw: str) -> str:
    # It travels in an HTTP header: visible ASCII only, so no encoding can change it on the way.
    value = raw.strip()
    if any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise ValueError("printable ASCII without spaces (or empty to turn the check off)")
    return value


def render(value: Any) -> str:
    """A parsed value as the environment string that sets it (Settings.effective)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)
