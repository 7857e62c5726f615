"""A real node whose index service waits before every search: `python -m tests.support.slow_index_node
--delay-file PATH` (the delay in ms that file holds, read again while a search waits:
tests.support.SlowIndex changes it at run time), with a node's environment. Requests stay in flight
on node 2 as long as a test needs."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from services import node
from services.roles.index.search import IndexService

# How often a waiting search looks at the delay again (a lowered delay releases it within this).
POLL_S = 0.02


def read_delay_ms(path: Path) -> float:
    """The delay `path` holds (ms; 'inf' holds searches until it changes); none written yet: 0."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0.0
    return float(text) if text else 0.0


def slow_down(delay_ms: Callable[[], float]) -> None:
    """Every IndexService.search of this process (the /search route's call) first waits until it has
    waited delay_ms(), asked again as it waits: a delay lowered meanwhile ends the wait sooner."""
    search = IndexService.search

    def slow_search(self, *args, **kwargs):
        started = time.monotonic()
        while (left := delay_ms() / 1000.0 - (time.monotonic() - started)) > 0:
            time.sleep(min(left, POLL_S))
        return search(self, *args, **kwargs)

    IndexService.search = slow_search


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay-file", type=Path, required=True,
                        help="a file holding the wait before each search (ms), read at every search and while it waits")
    path = parser.parse_args(argv).delay_file
    slow_down(lambda: read_delay_ms(path))
    return node.main()


if __name__ == "__main__":
    sys.exit(main())
