"""Argument helpers every profiling CLI shares: comma lists, positive numbers, where load may go."""
from __future__ import annotations

import argparse
import ipaddress
from typing import Callable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")


def split_list(raw: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: the items of a comma-separated option, blanks dropped."""
    return [part.strip() for part in raw.split(",") if part.strip()]


def comma_list(kind: Callable[[str], T], *, minimum: T | None = None, sort_unique: bool = False,
               what: str = "values", example: str = "1,2,4,8") -> Callable[[str], list[T]]:
    """An argparse `type` for a non-empty comma-separated list of `kind`, each >= minimum.

    sort_unique: the list sorted with repeats dropped (levels and batch sizes, where order
    and repeats mean nothing); otherwise it keeps the order given.
    """
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


def positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type`: a number of `kind` that is > 0."""
    def parse(raw: str) -> T:
        value = kind(raw)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{raw!r}: expected a number > 0")
        return value
    return parse


# ------------------------------------------------------------------------- where load may go

class TargetRefused(ValueError):
    """A URL this tool will not send to (not http, or not loopback without --allow-remote)."""


def add_allow_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-remote", action="store_true", help="allow non-loopback targets")


def check_target(url: str, allow_remote: bool) -> str:
    """The URL without a trailing slash, if it is http(s) and (unless allowed) loopback.

    Only literal loopback addresses and 'localhost' pass: a host name could
    resolve anywhere, so it is not resolved to decide.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r}: expected an http URL such as http://127.0.0.1:8000")
    if not allow_remote and not is_loopback(parts.hostname):
        raise TargetRefused(f"{url!r}: refusing to send load to {parts.hostname}: only loopback "
                            "(127.0.0.0/8, ::1, localhost) unless --allow-remote is given")
    return url.rstrip("/")


def check_targets(urls: Sequence[str], allow_remote: bool) -> list[str]:
    return [check_target(url, allow_remote) for url in urls]


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def node_urls(env: Mapping[str, str] | None = None, path: str = "") -> list[str]:
    """Every node's base URL from NODE_<n>_IP (ConfigError when unset or malformed), plus `path`."""
    from pipeline.config import Settings
    settings = Settings.from_env(env)
    return [f"{settings.node_address(n).url}{path}" for n in range(settings.total_nodes)]
