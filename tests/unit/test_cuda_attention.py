"""pipeline.kernels.cuda_attention: an encoder's batch in one masked call and a prompt's chunks with masks give each
row's real queries what the row alone gets (here on the CPU, to rounding: the masks and the cuts; on CUDA to the
bit, through the batch-invariant attention with cuDNN's kernel off)."""
import pytest
import torch

from pipeline.kernels import cuda_attention

ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where torch sees one")


def _qkv(rows: int, heads: int, length: int, device: str = "cpu", dtype=torch.float32, kv_heads: int | None = None):
    gen = torch.Generator(device=device).manual_seed(11)
    return (torch.randn(rows, h, length, 32, generator=gen, device=device, dtype=dtype)
            for h in (heads, kv_heads or heads, kv_heads or heads))


def test_an_encoders_padded_rows_get_in_one_call_what_each_gets_alone():
    query, key, value = _qkv(3, 4, 40)
    runs = [(0, 40), (0, 17), (0, 29)]  # right-padded, as a tokenizer pads an encoder's batch
    mask = (torch.arange(40)[None, :] < torch.tensor([end for _, end in runs])[:, None])[:, None, None, :].expand(3, 1, 40, 40)
    batch = cuda_attention.bidirectional(query, key, value, runs, mask, None)
    for row, (_, end) in enumerate(runs):
        alone = cuda_attention.bidirectional(query[row:row + 1, :, :end], key[row:row + 1, :, :end],
                                             value[row:row + 1, :, :end], [(0, end)], None, None)
        torch.testing.assert_close(batch[row, :end], alone[0], rtol=1e-6, atol=1e-6)


def test_a_row_padded_on_the_left_is_moved_to_column_0_first():
    query, key, value = _qkv(2, 4, 30)
    runs = [(0, 30), (12, 30)]
    batch = cuda_attention.bidirectional(query, key, value, runs, None, 0.2)
    alone = cuda_attention.bidirectional(query[1:, :, 12:], key[1:, :, 12:], value[1:, :, 12:], [(0, 18)], None, 0.2)
    assert torch.equal(batch[1, 12:], alone[0]) and not batch[1, :12].any()  # the same call, the padding untouched


def test_a_prompts_chunk_sees_the_keys_before_it_and_its_own_causally():
    query, key, value = _qkv(1, 14, 50, kv_heads=2)
    whole = cuda_attention.causal(query, key, value, 0.125)
    chunks = [cuda_attention.causal(query[:, :, a:b], key[:, :, :b], value[:, :, :b], 0.125)
              for a, b in ((0, 13), (13, 32), (32, 50))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), whole, rtol=1e-6, atol=1e-6)


class _Encoder(torch.nn.Module):
    is_causal = False


@ON_CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_an_encoders_padded_batch_on_cuda_gives_each_row_its_bits_alone(dtype):
    from pipeline.kernels.batch_invariance import _batch_invariant_sdpa, attend_without_cudnn
    before = torch.backends.cuda.cudnn_sdp_enabled()
    attend_without_cudnn()
    try:
        query, key, value = _qkv(4, 12, 301, "cuda", dtype)
        ends = [301, 150, 77, 290]
        mask = (torch.arange(301, device="cuda")[None, :] < torch.tensor(ends, device="cuda")[:, None])
        batch, _ = _batch_invariant_sdpa(_Encoder(), query, key, value, mask[:, None, None, :].expand(4, 1, 301, 301),
                                         scaling=0.125)
        for row, end in enumerate(ends):
            alone, _ = _batch_invariant_sdpa(_Encoder(), query[row:row + 1, :, :end], key[row:row + 1, :, :end],
                                             value[row:row + 1, :, :end], None, scaling=0.125)
            assert torch.equal(batch[row, :end], alone[0]), row
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
