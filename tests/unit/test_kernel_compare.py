"""profiling.kernel_compare: a decode step's kernel timed at the step's shapes, its figures written and printed."""
import json

import pytest

from pipeline.kernels import ordered_attention, vnni_int4, vnni_int8
from profiling import kernel_compare


@pytest.mark.slow  # its record names the commit: `git rev-parse`
@pytest.mark.skipif(ordered_attention.EXTENSION.ops() is None, reason="the ordered attention is not built for this CPU")
def test_the_attention_is_timed_for_each_dtype_and_row_count(tmp_path, capsys):
    args = ["--kernel", "attention", "--rows", "1,3", "--dtypes", "float32,bfloat16", "--length", "40",
            "--layers", "2", "--calls", "2", "--rounds", "2", "--out", str(tmp_path)]
    assert kernel_compare.main(args) == 0
    record = json.loads((tmp_path / "kernel_compare.json").read_text())
    assert record["compared"] is None and set(record["results"]) == {"unit", "here"}
    figures = record["results"]["here"]
    assert set(figures) == {"float32 1", "float32 3", "bfloat16 1", "bfloat16 3"}
    assert all(0 < f["best"] <= f["median"] for f in figures.values())
    assert "bfloat16      3" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("kernel, extension", [("int8-dynamic", vnni_int8.EXTENSION), ("int4-dynamic", vnni_int4.EXTENSION)])
def test_a_steps_products_are_timed_at_each_row_count(kernel, extension, tmp_path):
    if extension.ops() is None:
        pytest.skip(f"{extension.name} is not built for this CPU")
    args = ["--kernel", kernel, "--rows", "1,2", "--layers", "1", "--rounds", "1", "--out", str(tmp_path)]
    assert kernel_compare.main(args) == 0
    record = json.loads((tmp_path / "kernel_compare.json").read_text())
    assert record["results"]["unit"] == "ms a step" and set(record["results"]["here"]) == {"1", "2"}


def test_an_unknown_dtype_is_refused_by_name(tmp_path, capsys):
    assert kernel_compare.main(["--dtypes", "int8", "--out", str(tmp_path)]) == 2
    assert "--dtypes: unknown ['int8']" in capsys.readouterr().err
