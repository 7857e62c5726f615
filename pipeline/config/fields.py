"""How a settings field is bound to its environment variable: name, parser, default and help."""
from __future__ import annotations

from dataclasses import field
from typing import Any, Callable

import pipeline.config.parsers as p


def var(env: str, parse: Callable[[str], Any], default: str, help: str, *, secret: bool = False) -> Any:
    """A section field read from one environment variable; a secret one is left out of repr()."""
    return field(repr=not secret, metadata={"env": env, "parse": parse, "default": default, "help": help,
                                            "secret": secret})


def numbered(pattern: str, first: int, parse: Callable[[str], Any], default: Callable[[int], str], help: str) -> Any:
    """A section field read from a family of numbered variables, `pattern` with {n} for n >= first
    (NODE_{n}_IP): a dict n -> parsed value of those set; `default(n)` is what an unset one means.
    Documented as pattern with <n>."""
    return field(metadata={"env": pattern.format(n="<n>"), "numbered": pattern, "first": first, "parse": parse,
                           "default_for": default, "help": help})


def max_batch(stage: str, size: int, why: str) -> Any:
    return var(f"{stage.upper()}_MAX_BATCH", p.int_range(1, 4096), str(size),
               f"largest batch the {stage} stage runs ({why}; docs/performance.md)")


def max_wait(stage: str, wait_ms: int) -> Any:
    return var(f"{stage.upper()}_MAX_WAIT_MS", p.non_negative_float, str(wait_ms),
               f"how long the {stage} stage's oldest item may wait for a fuller batch (ms); not at all when no "
               "request in flight on the node may still join it")


def precision(stage: str, model: str) -> Any:
    return var(f"{stage.upper()}_PRECISION", p.optional(p.precision, ""), "",
               f"what the {model} computes in (empty: PRECISION's choice): {', '.join(p.PRECISION_CHOICES)}")
