"""builders.auto_index.pick: the one rule ``--index auto`` and ``profiling.index_bench --auto`` build by."""
from __future__ import annotations

import pytest

from builders.auto_index import pick
from builders.build_files import BuildError

ROWS = [
    {"spec": "big", "recall": 0.99, "search_ms_batch32": 5.0, "bytes": 300},
    {"spec": "slow", "recall": 0.96, "search_ms_batch32": 60.0, "bytes": 100},  # over the budget
    {"spec": "lossy", "recall": 0.90, "search_ms_batch32": 1.0, "bytes": 50},  # under the floor
    {"spec": "edge", "recall": 0.95, "search_ms_batch32": 50.0, "bytes": 200},  # on both limits: fits
]


def test_the_least_bytes_among_those_meeting_the_floor_within_the_budget():
    chosen, record = pick(ROWS, 0.95, 50.0, size="bytes")
    assert chosen["spec"] == record["chosen"] == "edge"
    assert record["candidates"] == ROWS and record["floor"] == 0.95 and record["latency_budget_ms"] == 50.0
    assert record["rule"] == "least bytes among candidates with recall >= floor and search_ms_batch32 <= budget"


def test_no_candidate_fitting_is_an_error_naming_each_figure():
    with pytest.raises(BuildError, match=r"no candidate meets recall@10 0.95 within 50 ms: slow recall 0.96 60.0 ms; "
                                         r"lossy recall 0.9 1.0 ms"):
        pick(ROWS[1:3], 0.95, 50.0, size="bytes")
