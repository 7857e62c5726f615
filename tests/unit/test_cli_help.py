"""Every profiling tool's --help documents every option with its default (profiling.lib.cli.HelpFormatter)."""
from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest

import profiling
from profiling.lib import cli

# The tools this test must cover; any other module in profiling/ with a parser() is checked too.
TOOLS = ("bench_decode", "latency_breakdown", "loadgen", "microbench", "roofline", "select_variants", "service_protocol", "soak")


def tools_with_parsers() -> list[str]:
    found = {m.name for m in pkgutil.iter_modules(profiling.__path__) if not m.ispkg}
    return sorted(set(TOOLS) | {name for name in found if hasattr(importlib.import_module(f"profiling.{name}"),
                                                                  "parser")})


def test_every_listed_tool_has_a_parser():
    missing = [name for name in TOOLS if not callable(getattr(importlib.import_module(f"profiling.{name}"),
                                                              "parser", None))]
    assert not missing


def help_problems(p: argparse.ArgumentParser) -> list[str]:
    """Each option whose --help line lacks a help text, or does not state its default (or 'required')."""
    formatter = p._get_formatter()
    problems = []
    for action in p._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            problems.append(f"{action.option_strings[0]}: no help text")
            continue
        shown = formatter._expand_help(action)  # exactly what --help prints for it
        expected = cli.default_text(action) % {} if "%(default)" not in action.help else str(action.default)
        if expected not in shown:
            problems.append(f"{action.option_strings[0]}: help does not state the default: {shown!r}")
    return problems


@pytest.mark.parametrize("tool", tools_with_parsers())
def test_every_option_states_its_default(tool):
    p = importlib.import_module(f"profiling.{tool}").parser()
    assert help_problems(p) == [], tool
    assert p.format_help()  # and the whole page renders (a stray % in a help text would raise here)


def test_the_check_catches_an_option_without_help_or_default():
    p = argparse.ArgumentParser()  # the plain formatter shows no defaults
    p.add_argument("--count", type=int, default=5, help="how many")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--url", required=True, help="where")  # required: --help must say so
    assert help_problems(p) == ["--count: help does not state the default: 'how many'", "--quiet: no help text",
                                "--url: help does not state the default: 'where'"]
    assert help_problems(cli.make_parser("t", None)) == []
    fixed = cli.make_parser("t")
    fixed.add_argument("--count", type=int, default=5, help="how many")
    fixed.add_argument("--url", required=True, help="where")
    assert help_problems(fixed) == []


def test_the_default_reads_naturally():
    p = cli.make_parser("t")
    p.add_argument("--flag", action="store_true", help="a flag")
    p.add_argument("--sizes", default=[1, 2, 4], help="sizes")
    p.add_argument("--unset", default=None, help="maybe")
    p.add_argument("--url", required=True, help="where")
    p.add_argument("--pct", default="5%", help="a percentage")
    text = " ".join(p.format_help().split())
    for piece in ("a flag (default: off)", "sizes (default: 1,2,4)", "maybe (default: unset)", "where (required)",
                  "a percentage (default: 5%)"):
        assert piece in text
