"""profiling.prompt_attention: a prompt's attention timed through SDPA and the ordered kernel, its figures written."""
import json

import pytest

from pipeline.kernels import ordered_attention
from profiling import prompt_attention


def test_the_prompt_is_cut_at_the_multiples_of_the_chunk_or_left_whole():
    assert prompt_attention.pieces(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert prompt_attention.pieces(10, 0) == [(0, 10)]


@pytest.mark.slow  # its record names the commit: `git rev-parse`
@pytest.mark.skipif(ordered_attention.EXTENSION.ops() is None, reason="the ordered attention is not built for this CPU")
def test_both_kernels_are_timed_for_each_dtype_and_length(tmp_path, capsys):
    args = ["--lengths", "40,70", "--chunk", "32", "--dtypes", "float32,bfloat16", "--layers", "2", "--rounds", "2",
            "--out", str(tmp_path)]
    assert prompt_attention.main(args) == 0
    record = json.loads((tmp_path / "prompt_attention.json").read_text())
    figures = record["results"]
    assert set(figures) == {"float32 40", "float32 70", "bfloat16 40", "bfloat16 70"}
    for figure in figures.values():
        assert all(0 < figure[kernel]["best"] <= figure[kernel]["median"] for kernel in ("sdpa", "ordered"))
        assert 0 <= figure["largest_difference"] < 3e-2
    assert "\nbfloat16       70 " in capsys.readouterr().out


def test_an_unknown_dtype_is_refused_by_name(tmp_path, capsys):
    assert prompt_attention.main(["--dtypes", "int8", "--out", str(tmp_path)]) == 2
    assert "--dtypes: unknown ['int8']" in capsys.readouterr().err
