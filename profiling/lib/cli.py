"""Argument helpers every profiling CLI shares: comma lists, positive numbers, where load may go."""
from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import Callable, Sequence, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help shows the tool's docstring as written and every option's default (default_text).

    An option needs a help text for its default to show (tests/unit/test_cli_help.py checks every tool)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = (action.help or "").strip()
        extra = "" if "%(default)" in help else default_text(action)
        return f"{help} {extra}".strip() if extra else help


def default_text(action: argparse.Action) -> str:
    """'(required)', '(default: ...)' with "off"/"on" for a flag, "1,2,4" for a list and "unset" for None,
    or '' (no default to show)."""
    if action.required:
        return "(required)"
    if action.default is argparse.SUPPRESS or not action.option_strings or isinstance(action, argparse._HelpAction):
        return ""
    value = action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        shown = "on" if value else "off"
    elif value is None:
        shown = "unset"
    elif isinstance(value, (list, tuple)):
        shown = ",".join(map(str, value))
    else:
        shown = str(value)
    return f"(default: {shown.replace('%', '%%')})"


def make_parser(prog: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help states every option's default (HelpFormatter)."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter, **kwargs)


def split_list(raw: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: the items of a comma-separated option, blanks dropped."""
    return [part.strip() for part in raw.split(",") if part.strip()]


def comma_list(kind: Callable[[str], T], *, minimum: T | None = None, sort_unique: bool = False,
               what: str = "values", example: str = "1,2,4,8") -> Callable[[str], list[T]]:
    """An argparse `type` for a non-empty comma-separated list of `kind`, each >= minimum.

    sort_unique: the list sorted with repeats dropped (levels and batch sizes, where order
    and repeats mean nothing); otherwise it keeps the order given."""
    def parse(raw: str) -> list[T]:
        try:
            values = [kind(part) for part in split_list(raw)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r}: expected comma-separated {what}, e.g. {example}") from None
        # `not v >= minimum` also refuses NaN
        if not values or (minimum is not None and any(not v >= minimum for v in values)):
            raise argparse.ArgumentTypeError(f"{raw!r}: expected one or more {what}"
                                             + (f", each >= {minimum}" if minimum is not None else ""))
        return sorted(set(values)) if sort_unique else values
    return parse


def choice_list(allowed: Sequence[str], what: str, example: str) -> Callable[[str], list[str]]:
    """An argparse `type`: a comma-separated list of `what` out of `allowed`, in the order given, repeats dropped."""
    def parse(raw: str) -> list[str]:
        names = comma_list(str, what=what, example=example)(raw)
        unknown = [s for s in names if s not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}: expected some of {', '.join(allowed)}")
        return list(dict.fromkeys(names))
    return parse


def stage_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse `type`: a comma-separated list of stages out of `allowed`, repeats dropped."""
    return choice_list(allowed, "stages", "embed,rerank")


def positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type`: a number of `kind` that is > 0."""
    def parse(raw: str) -> T:
        value = kind(raw)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{raw!r}: expected a number > 0")
        return value
    return parse


class TargetRefused(ValueError):
    """A URL this tool will not send to (not http, or not loopback without --allow-remote)."""


def add_out(parser: argparse.ArgumentParser, tool: str) -> None:
    """--out: where results go; unset, a fresh runs/<tool>-<UTC time>/ per run (report.run_folder)."""
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder; unset: a fresh runs/{tool}-<UTC time>/ for each run, so none overwrites "
                             "another")


def add_cluster_args(parser: argparse.ArgumentParser, tool: str, wait_health_s: float,
                     metrics: str = "--metrics-urls") -> None:
    """What every tool that measures a cluster takes: node 0's --url, the nodes to scrape (prometheus.find_nodes),
    --wait-health, --allow-remote and --out."""
    parser.add_argument("--url", required=True, help="node 0's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(metrics, default=None,
                        help="comma-separated node URLs to scrape, node 0 first (or N=URL,...; a trailing /metrics is "
                             "dropped), or 'none'; unset: node 0 at --url and the peers its /health lists")
    parser.add_argument("--wait-health", type=float, default=wait_health_s,
                        help="how long to wait for node 0's /health 200 first (s)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow non-loopback targets (by default only 127.0.0.0/8, ::1 and localhost)")
    add_out(parser, tool)


def check_target(url: str, allow_remote: bool) -> str:
    """The URL without a trailing slash, if it is http(s) and (unless allowed) loopback.

    Only literal loopback addresses and 'localhost' pass: a host name could
    resolve anywhere, so it is not resolved to decide."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r}: expected an http URL such as http://127.0.0.1:8000")
    try:
        loopback = parts.hostname.lower() == "localhost" or ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:  # a host name: not resolved, it could resolve anywhere
        loopback = False
    if not allow_remote and not loopback:
        raise TargetRefused(f"{url!r}: refusing to send load to {parts.hostname}: only loopback "
                            "(127.0.0.0/8, ::1, localhost) unless --allow-remote is given")
    return url.rstrip("/")

