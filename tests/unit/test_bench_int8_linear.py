"""profiling/bench_int8_linear: the anchored fbgemm path really is int8-dynamic's arithmetic."""
import pytest
import torch

from profiling import bench_int8_linear as bench


def test_anchored_fbgemm_sums_equal_int_mm_and_rows_do_not_depend_on_their_batch():
    models = bench.variants(64, 48)
    bench.check(models, rows=9)  # raises on any differing bit
    x = torch.randn(5, 64)
    assert torch.equal(models[bench.ANCHORED](x), models["_int_mm per row"](x))


def test_check_catches_a_path_whose_sums_differ():
    models = bench.variants(64, 48)
    models[bench.ANCHORED]._fbgemm.anchor[0, 0] = -64.0  # scale no longer 1: codes requantized
    with pytest.raises(AssertionError, match="differ"):
        bench.check(models, rows=9)


def test_cli_prints_one_row_per_shape_and_row_count(capsys):
    assert bench.main(["--rows", "1,3", "--repeat", "1", "--shapes", "32x16,16x8", "--check"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.lstrip()[:2].isdigit()]
    assert [(r[0], r[1]) for r in rows] == [("32x16", "1"), ("32x16", "3"), ("16x8", "1"), ("16x8", "3")]
    assert all(float(v) > 0 for r in rows for v in r[2:])
