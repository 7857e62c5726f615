"""A real node whose index service sleeps before every search: `python -m tests.support.slow_index_node
--delay-ms 1000` with a node's environment. Requests stay in flight on node 2 as long as a test needs."""
from __future__ import annotations

import argparse
import sys
import time

from services import node
from services.roles.index.search import IndexService


def slow_down(delay_s: float) -> None:
    """Every IndexService.search of this process sleeps `delay_s` first (the /search route's call)."""
    search = IndexService.search

    def slow_search(self, *args, **kwargs):
        time.sleep(delay_s)
        return search(self, *args, **kwargs)

    IndexService.search = slow_search


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay-ms", type=float, required=True, help="sleep before each search (ms)")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error("--delay-ms must be >= 0")
    slow_down(args.delay_ms / 1000.0)
    return node.main()


if __name__ == "__main__":
    sys.exit(main())
