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


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.unit.test_precision" name="test_a[cuda-dtype0]" time="0.1" />
<testcase classname="tests.unit.test_precision" name="test_b[cuda]" time="0.1"><failure message="boom">x</failure></testcase>
<testcase classname="tests.unit.test_chunked_attention" name="test_c[matmul-cuda-bfloat16]" time="0.0">
<skipped type="pytest.skip" message="no CUDA device here">why</skipped></testcase>
<testcase classname="tests.unit.test_batch_invariance" name="test_d[cuda]" time="0.0"><error message="e">y</error></testcase>
</testsuite></testsuites>"""


def test_the_cuda_tests_outcomes_are_read_by_test_id_and_the_failures_listed():
    from profiling.gpu_check import junit_outcomes, results
    tests = junit_outcomes(JUNIT)
    assert tests == {"tests/unit/test_precision.py::test_a[cuda-dtype0]": "passed",
                     "tests/unit/test_precision.py::test_b[cuda]": "failed",
                     "tests/unit/test_chunked_attention.py::test_c[matmul-cuda-bfloat16]": "skipped: no CUDA device here",
                     "tests/unit/test_batch_invariance.py::test_d[cuda]": "error"}
    found = results({"auto": {"idle": 1.5}}, tests, device="torch 2.11.0 | NVIDIA H200", commit="abc", profile="faithful",
                    failed=True)
    assert found["cuda_tests_passed"] == 1
    assert found["cuda_tests_failed"] == ["tests/unit/test_batch_invariance.py::test_d[cuda]",
                                          "tests/unit/test_precision.py::test_b[cuda]"]
    assert (found["device"], found["commit"], found["precisions"]) == ("torch 2.11.0 | NVIDIA H200", "abc",
                                                                      {"auto": {"idle": 1.5}})
    assert results({}, None, device="d", commit="c", profile="tiny", failed=True)["cuda_tests_failed"] is None
