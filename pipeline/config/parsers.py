"""Parsers of environment strings: each takes the raw text and returns the value, or raises
ValueError whose text says what is accepted (the settings put it in the operator's message)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

DTYPES = ("auto", "float32", "bfloat16", "float16")
# How a model stage computes (pipeline/precision.py): exact = its *_DTYPE, fast = the table
# of each stage's fastest variant on this hardware, or one variant by name.
PRECISION_MODES = ("exact", "fast")
PRECISION_VARIANTS = ("float32", "bfloat16", "int8-dynamic", "int8-weight")


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        what = "an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
        if lo is not None and hi is not None:
            what = f"an integer from {lo} to {hi}"
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(what) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(what)
        return value
    return parse


def positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a number > 0") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("a number > 0")
    return value


def non_negative_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a number >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("a number >= 0")
    return value


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


def optional_dtype(raw: str) -> str:
    return "" if not raw.strip() else choice(*DTYPES)(raw)


def optional_precision(raw: str) -> str:
    return "" if not raw.strip() else choice(*PRECISION_MODES, *PRECISION_VARIANTS)(raw)


def address(raw: str) -> Address:
    what = "host:port with a port from 1 to 65535 (for example 10.0.0.5:8000)"
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(what)
    return Address(host.strip("[]"), int(port))


def path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("a file system path")
    value = Path(raw.strip()).expanduser()
    return value if value.is_absolute() else (Path.cwd() / value)


def optional_path(raw: str) -> Path | None:
    return path(raw) if raw.strip() else None


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


def optional_node(raw: str) -> int | None:
    return int_range(0, MAX_NODES - 1)(raw) if raw.strip() else None


def optional_node_list(raw: str) -> tuple[int, ...]:
    """A node_list, or () when empty."""
    return node_list(raw) if raw.strip() else ()


def optional_host(raw: str) -> str:
    """A host name or address to listen on (no port), or "" when empty."""
    value = raw.strip().strip("[]")
    if value and (any(c.isspace() or c in "/@" for c in value) or ":" in value and value.count(":") < 2):
        raise ValueError("a host name or IP address without a port (for example 0.0.0.0), or empty")
    return value


def text(raw: str) -> str:
    return raw


def float_range(lo: float, hi: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"a number from {lo:g} to {hi:g}") from None
        if not lo <= value <= hi:
            raise ValueError(f"a number from {lo:g} to {hi:g}")
        return value
    return parse


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
