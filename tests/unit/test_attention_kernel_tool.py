"""profiling.attention_kernel: the kernel timed at a decode step's shapes, its figures written and printed."""
import json

import pytest

from pipeline.kernels.ordered_attention import EXTENSION
from profiling import attention_kernel

pytestmark = pytest.mark.skipif(EXTENSION.ops() is None, reason="the ordered attention is not built for this CPU")


@pytest.mark.slow  # its record names the commit: `git rev-parse`
def test_it_times_each_dtype_and_row_count_and_writes_them(tmp_path, capsys):
    args = ["--rows", "1,3", "--dtypes", "float32,bfloat16", "--length", "40", "--layers", "2", "--calls", "2",
            "--rounds", "2", "--out", str(tmp_path)]
    assert attention_kernel.main(args) == 0
    record = json.loads((tmp_path / "attention_kernel.json").read_text())
    assert record["compared"] is None and set(record["results"]) == {"here"}
    figures = record["results"]["here"]
    assert set(figures) == {"float32 1", "float32 3", "bfloat16 1", "bfloat16 3"}
    assert all(0 < f["best_us"] <= f["median_us"] for f in figures.values())
    assert "bfloat16      3" in capsys.readouterr().out


def test_an_unknown_dtype_is_refused_by_name(tmp_path, capsys):
    assert attention_kernel.main(["--dtypes", "int8", "--out", str(tmp_path)]) == 2
    assert "--dtypes: unknown ['int8']" in capsys.readouterr().err
