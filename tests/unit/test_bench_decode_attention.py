"""profiling/bench_decode_attention: the loop-free blocked attention is attention, and each row is
bit-identical alone and in a left-padded batch."""
import pytest
import torch

from profiling import bench_decode_attention as bench


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_alone_equals_the_row_in_any_left_padded_batch(dtype, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # partial and whole blocks, a lone key, two rows of one width (no padding between them)
        lengths = [1, 37, bench.BLOCK - 1, bench.BLOCK, bench.BLOCK + 1, 300, 777, 777, 1500]
        bench.check(dtype, lengths)  # raises on any differing bit
        query, key, value, mask, _ = bench.left_padded(lengths, dtype)
        batch = bench.blocked_attention(query, key, value, mask, 0.125)
        for row in range(len(lengths)):
            mates = [row, (row + 3) % len(lengths)]  # another batch-mate, another padding
            pair = bench.blocked_attention(query[mates], key[mates], value[mates], mask[mates], 0.125)
            assert torch.equal(pair[0], batch[row]), row
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_it_is_the_attention_sdpa_computes(dtype, atol):
    lengths = [5, 200, 600]
    query, key, value, mask, starts = bench.left_padded(lengths, dtype, seed=1)
    out = bench.blocked_attention(query, key, value, mask, 0.125)
    assert out.shape == (3, 1, bench.HEADS, bench.DIM) and out.dtype == dtype
    group = bench.HEADS // bench.KV_HEADS
    for row, start in enumerate(starts):
        k = key[row:row + 1, :, start:].float().repeat_interleave(group, dim=1)
        v = value[row:row + 1, :, start:].float().repeat_interleave(group, dim=1)
        expected = torch.nn.functional.scaled_dot_product_attention(query[row:row + 1].float(), k, v, scale=0.125)
        torch.testing.assert_close(out[row].float(), expected.transpose(1, 2)[0], rtol=0, atol=atol)


def test_check_catches_a_row_that_sees_its_padding(monkeypatch):
    real = bench.blocked_attention
    monkeypatch.setattr(bench, "blocked_attention", lambda q, k, v, mask, scaling: real(q, k, v, None, scaling))
    with pytest.raises(AssertionError, match="differs alone"):
        bench.check(torch.float32, [3, 200])


def test_cli_prints_one_row_per_dtype_width_and_row_count(capsys):
    assert bench.main(["--rows", "1,2", "--widths", "40", "--repeat", "1", "--check"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["float32"],
                                                                                                  ["bfloat16"])]
    assert [(r[0], r[1], r[2]) for r in rows] == [("float32", "40", "1"), ("float32", "40", "2"),
                                                   ("bfloat16", "40", "1"), ("bfloat16", "40", "2")]
    assert all(float(v) > 0 for r in rows for v in r[3:])
