"""profiling.gpu_check: the table it prints, and a spent budget skipping what is left."""
import argparse

import pytest

from profiling.gpu_check import Check, OverBudget, table


def test_the_table_has_the_issues_columns_and_a_dash_for_what_was_not_measured():
    rows = {"auto": {"idle": 1.234, "c8": 43.61, "c32": 97.5, "steps": [51.0, 220.04, 220.0], "graphs": [1, 2, 3]},
            "int8-dynamic": {"idle": 5.6, "steps": [39.0, 80.0, 174.0], "graphs": [None, None, None]}}
    assert table(rows).splitlines() == [
        "| | idle request | concurrency 8 | concurrency 32 | decode step, 1 / 8 / 32 sequences | CUDA graphs |",
        "|---|---|---|---|---|---|",
        "| auto | 1.23 s | 43.6 req/min | 97.5 req/min | 51.0 / 220.0 / 220.0 ms | 1 / 2 / 3 |",
        "| int8-dynamic | 5.60 s | - req/min | - req/min | 39.0 / 80.0 / 174.0 ms | - / - / - |"]
    assert table({"auto": {}}).splitlines()[-1] == "| auto | - s | - req/min | - req/min | - / - / - ms | - / - / - |"


def test_a_phase_after_the_budget_is_spent_is_skipped(tmp_path):
    check = Check(argparse.Namespace(budget_s=0.0, out=str(tmp_path), tiny=True))
    with pytest.raises(OverBudget):
        check.run("standins", ["builders.standins", "--profile", "tiny"])
    assert not (tmp_path / "standins.log").exists()
