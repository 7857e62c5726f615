"""Node entry points for tests: each wraps one component of a real node, then runs `services.node.main()`.

Production code carries no test hooks; a test that needs a slow index server or a generate stage
that dies starts that node with one of these commands (`LocalCluster.start_node(node, command=...)`).
"""
from __future__ import annotations

import sys


def slow_index_command(delay_ms: float, python: str = sys.executable) -> list[str]:
    """A node 2 whose every /search first sleeps `delay_ms` (a slow index server)."""
    return [python, "-m", "tests.support.slow_index_node", "--delay-ms", str(delay_ms)]


def failing_generate_command(python: str = sys.executable) -> list[str]:
    """A worker whose continuous generate engine fails every iteration, and its cleanup too (a dying stage)."""
    return [python, "-m", "tests.support.failing_generate_node"]
