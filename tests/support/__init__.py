"""Node entry points for tests: each wraps one component of a real node, then runs `services.node.main()`.

Production code carries no test hooks; a test that needs a slow index server or a generate stage
that dies starts that node with one of these commands (`LocalCluster.start_node(node, command=...)`).
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


class SlowIndex:
    """The delay of an index node started with `command()`, changed while it runs (no restart): every
    /search waits until it has waited the delay written last, so a search already waiting is released
    by a lower delay. Starts at 0 (a usual index node)."""

    def __init__(self, delay_file: Path):
        self.delay_file = Path(delay_file)
        self.set(0)

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", "tests.support.slow_index_node", "--delay-file", str(self.delay_file)]

    def set(self, delay_ms: float) -> None:
        """From now on every search, those waiting included, waits `delay_ms` (math.inf: until the next set)."""
        partial = self.delay_file.with_name(self.delay_file.name + ".partial")
        partial.write_text(repr(float(delay_ms)))
        os.replace(partial, self.delay_file)  # whole: the node never reads half a number

    @contextmanager
    def delayed(self, delay_ms: float) -> Iterator[None]:
        """Searches wait `delay_ms` inside the block; on leaving it, 0 again (waiting searches go on)."""
        self.set(delay_ms)
        try:
            yield
        finally:
            self.set(0)

    def held(self) -> AbstractContextManager[None]:
        """Searches wait inside the block, however long it lasts: requests stay in flight on the index
        until the block ends (the test lets them go)."""
        return self.delayed(math.inf)


def failing_generate_command(python: str = sys.executable) -> list[str]:
    """A worker whose continuous generate engine fails every iteration, and its cleanup too (a dying stage)."""
    return [python, "-m", "tests.support.failing_generate_node"]
