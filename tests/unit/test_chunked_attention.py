"""pipeline.kernels.chunked_attention: one call for a padded batch, each row bit-identical to the row alone."""
import pytest
import torch

from pipeline.kernels.chunked_attention import (
    CHUNK,
    chunked_attention,
    chunked_attention_forward,
    flash_chunked_attention,
    matmul_chunked_attention,
    sum_in_order,
)
from pipeline.kernels.ordered_attention import EXTENSION as ORDERED
from pipeline.kernels.ordered_attention import ordered_attention

HEADS, KV_HEADS, DIM, SCALING = 14, 2, 64, 0.125
LENGTHS = [1, 37, CHUNK, CHUNK + 1, 300, 3 * CHUNK + 9]  # inside, at and across chunk boundaries


def matmul_in_tiles_of_2(*args, **kwargs):
    """The matrix-product kernel in tiles of 2 rows on the CPU: the same code in more tiles, and less
    padding to compute there (CUDA's cases run its default tiles)."""
    return matmul_chunked_attention(*args, tile_rows=2, **kwargs)


ORDERED_BUILT = pytest.mark.skipif(ORDERED.ops() is None, reason="the ordered attention is not built for this CPU")
KERNELS = [flash_chunked_attention, matmul_in_tiles_of_2, pytest.param(ordered_attention, marks=ORDERED_BUILT)]
ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where torch sees one")
# (kernel, device, dtype): the flash kernel is the CPU's; the matrix-product kernel runs on CUDA too, in
# the dtypes CUDA is offered in (float32 is not: pipeline/precision_policy.py).
PLACED = [pytest.param((attend, "cpu", dtype), id=f"{attend.__name__.split('_')[0]}-cpu-{str(dtype)[6:]}")
          for attend in (flash_chunked_attention, matmul_in_tiles_of_2) for dtype in (torch.float32, torch.bfloat16)] + [
    pytest.param((ordered_attention, "cpu", dtype), id=f"ordered-cpu-{str(dtype)[6:]}", marks=ORDERED_BUILT)
    for dtype in (torch.float32, torch.bfloat16, torch.float16)] + [
    pytest.param((matmul_chunked_attention, "cuda", dtype), id=f"matmul-cuda-{str(dtype)[6:]}", marks=ON_CUDA)
    for dtype in (torch.bfloat16, torch.float16)]


def padded_batch(lengths, queries, dtype, padded_on, seed=0):
    """query, key, value and a per-key mask (rows, width) of rows padded on one side, the keys a view
    of wider buffers (as a cache with spare columns), padding columns holding other rows' noise."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    key = torch.randn(len(lengths), KV_HEADS, width + 7, DIM, generator=g).to(dtype)[:, :, :width]
    value = torch.randn(len(lengths), KV_HEADS, width + 7, DIM, generator=g).to(dtype)[:, :, :width]
    query = (3 * torch.randn(len(lengths), HEADS, queries, DIM, generator=g)).to(dtype)
    n = torch.tensor(lengths)[:, None]
    cols = torch.arange(width)[None, :]
    return query, key, value, (cols >= width - n) if padded_on == "left" else (cols < n)


def batch_mask(key_mask, lengths, queries, causal):
    """The bool (rows, 1, queries, width) mask of a right-padded batch: a row's own keys, and with
    `causal` the keys up to each query (query i is the row's key length - queries + i)."""
    width = key_mask.shape[1]
    mask = key_mask[:, None, None, :].expand(-1, 1, queries, -1)
    if not causal:
        return mask
    last = torch.tensor(lengths)[:, None] - queries + torch.arange(queries)[None, :]  # each query's own key
    return mask & (torch.arange(width)[None, None, None, :] <= last[:, None, :, None])


@pytest.mark.parametrize("placed", PLACED)
@pytest.mark.parametrize("queries,causal", [(1, False), (5, True), (5, False)])
def test_a_row_alone_equals_the_row_in_a_padded_batch_bit_for_bit(placed, queries, causal):
    attend, device, dtype = placed
    query, key, value, key_mask = padded_batch(LENGTHS, queries, dtype, "right")
    mask = batch_mask(key_mask, LENGTHS, queries, causal)
    query, key, value, mask = (t.to(device) for t in (query, key, value, mask))
    batch = attend(query, key, value, mask, scaling=SCALING)
    assert not batch.isnan().any()
    for row, length in enumerate(LENGTHS):
        alone = attend(query[row:row + 1], key[row:row + 1, :, :length], value[row:row + 1, :, :length],
                       scaling=SCALING, is_causal=causal)
        assert torch.equal(alone[0], batch[row]), f"row of {length} keys, {attend.__name__}"
    # and with other batch-mates: the first two rows alone as a batch of their own
    pair = attend(query[:2], key[:2, :, :CHUNK + 1], value[:2, :, :CHUNK + 1],
                  batch_mask(key_mask[:2, :CHUNK + 1], LENGTHS[:2], queries, causal).to(device), scaling=SCALING)
    assert torch.equal(pair, batch[:2])


@pytest.mark.parametrize("attend", KERNELS)
def test_each_row_is_attention_over_its_own_keys(attend):
    queries = 4
    query, key, value, key_mask = padded_batch(LENGTHS, queries, torch.float32, "right", seed=1)
    got = attend(query, key, value, batch_mask(key_mask, LENGTHS, queries, True), scaling=SCALING)
    for row, length in enumerate(LENGTHS):
        k, v = (t[row:row + 1, :, :length].double().repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (key, value))
        sees = torch.arange(length)[None, :] <= torch.arange(length - queries, length)[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(query[row:row + 1].double(), k, v, attn_mask=sees,
                                                                scale=SCALING)
        seen = sees.any(dim=1)  # a query before the row's first key sees nothing: zeros
        assert torch.allclose(got[row][:, seen].double(), want[0][:, seen], atol=2e-5)
        assert not got[row][:, ~seen].any()


@pytest.mark.parametrize("attend", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_counted_from_the_first_key_a_prompt_cut_into_pieces_gives_the_same_rows(attend, dtype):
    """Prefill in one pass, in pieces, and one token at a time (a decode step) round the same."""
    n = 3 * CHUNK - 40
    query, key, value, _ = padded_batch([n], n, dtype, "right", seed=2)
    whole = attend(query, key, value, scaling=SCALING, is_causal=True)
    for cuts in [(0, 300, 301, n), (0, 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3, n)]:
        for a, b in zip(cuts, cuts[1:]):
            piece = attend(query[:, :, a:b], key[:, :, :b], value[:, :, :b], scaling=SCALING, is_causal=True)
            assert torch.equal(piece, whole[:, :, a:b]), f"queries {a}..{b}"


BUILT_OR_NOT = [pytest.param(True, marks=ORDERED_BUILT), False]


@pytest.mark.parametrize("built", BUILT_OR_NOT, ids=["ordered-built", "not-built"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_left_padded_decode_step_equals_each_row_alone_in_the_transformers_form(dtype, built, monkeypatch):
    """transformers' generate pads on the left: each row gets its bits alone (the chunked kernels' rows moved
    to column 0 first; the ordered kernel skips the padding where it lies)."""
    if not built:
        monkeypatch.setattr(ORDERED, "ops", lambda: None)
    query, key, value, key_mask = padded_batch(LENGTHS, 1, dtype, "left", seed=3)
    out, weights = chunked_attention_forward(torch.nn.Module(), query, key, value, key_mask[:, None, None, :],
                                             scaling=SCALING)
    assert weights is None and out.shape == (len(LENGTHS), 1, HEADS, DIM)
    width = key.shape[2]
    for row, length in enumerate(LENGTHS):
        alone = chunked_attention(query[row:row + 1], key[row:row + 1, :, width - length:],
                                  value[row:row + 1, :, width - length:], scaling=SCALING)
        assert torch.equal(out[row], alone[0].transpose(0, 1)), f"row of {length} keys"


@pytest.mark.parametrize("built", BUILT_OR_NOT, ids=["ordered-built", "not-built"])
def test_the_cpu_runs_the_ordered_kernel_where_built_else_the_flash_chunks(built, monkeypatch):
    if not built:
        monkeypatch.setattr(ORDERED, "ops", lambda: None)
    query, key, value, key_mask = padded_batch([300, 40], 1, torch.bfloat16, "right")
    mask = key_mask[:, None, None, :]
    want = (ordered_attention if built else flash_chunked_attention)(query, key, value, mask, scaling=SCALING)
    assert torch.equal(chunked_attention(query, key, value, mask, scaling=SCALING), want)
    out, weights = chunked_attention_forward(torch.nn.Module(), query, key, value, mask, scaling=SCALING,
                                             keys_start_at_column_0=True)
    assert weights is None and torch.equal(out, want.transpose(1, 2))
    if built:  # the two kernels round differently: which one runs is seen in the bits
        assert not torch.equal(want, flash_chunked_attention(query, key, value, mask, scaling=SCALING))


# Rows of 7, 11, 13-15 chunks and more: where a tree-shaped sum over the chunks (CUDA's scan) would
# group a row's chunks differently alone than beside a row with more chunks.
MANY_CHUNKS = [7 * CHUNK - 3, 11 * CHUNK, 13 * CHUNK + 1, 15 * CHUNK, 15 * CHUNK + 1, 17 * CHUNK - 9]


@pytest.mark.parametrize("placed", PLACED)
def test_a_row_of_many_chunks_alone_equals_the_row_beside_a_longer_one(placed):
    attend, device, dtype = placed
    lengths = MANY_CHUNKS + [20 * CHUNK + 5]  # the longer batch-mate: 21 chunks
    query, key, value, key_mask = padded_batch(lengths, 1, dtype, "right", seed=4)
    mask = batch_mask(key_mask, lengths, 1, False)
    query, key, value, mask = (t.to(device) for t in (query, key, value, mask))
    batch = attend(query, key, value, mask, scaling=SCALING)
    for row, length in enumerate(MANY_CHUNKS):
        alone = attend(query[row:row + 1], key[row:row + 1, :, :length], value[row:row + 1, :, :length],
                       scaling=SCALING)
        assert torch.equal(alone[0], batch[row]), f"row of {length} keys ({-(-length // CHUNK)} chunks)"
        pair = [row, len(lengths) - 1]  # the row and the longest one only
        two = attend(query[pair], key[pair], value[pair], mask[pair], scaling=SCALING)
        assert torch.equal(two[0], batch[row]), f"row of {length} keys beside the longest alone"


def test_the_chunks_are_summed_first_to_last_whatever_the_device():
    # 2**60 - 2**60 + 2**-10: first to last gives 2**-10; any other grouping loses it to rounding
    parts = [torch.tensor([2.0 ** 60]), torch.tensor([-2.0 ** 60]), torch.tensor([2.0 ** -10])]
    assert sum_in_order(parts).item() == 2.0 ** -10
    assert sum_in_order(parts[::-1]).item() == 0.0
    assert sum_in_order(parts).dtype == torch.float32


@pytest.mark.parametrize("attend", KERNELS, ids=lambda f: f.__name__)
def test_each_cpu_kernel_adds_a_rows_chunks_first_to_last(attend):
    """Keys in three chunks whose values are 2**60, -2**60 and 2**-10, every score equal: added first to
    last the row keeps 2**-10's share; added in any other order (last first, or pairwise from the end)
    it is lost to rounding. So a kernel that changed its order fails here, on the CPU."""
    query = torch.zeros(1, HEADS, 1, DIM)
    key = torch.zeros(1, KV_HEADS, 3 * CHUNK, DIM)
    value = torch.cat([torch.full((1, KV_HEADS, CHUNK, DIM), v) for v in (2.0 ** 60, -2.0 ** 60, 2.0 ** -10)], dim=2)
    out = attend(query, key, value, scaling=SCALING)
    want = torch.tensor(2.0 ** -10 / 3, dtype=torch.float32)  # each chunk's share weighs one third
    assert torch.equal(out, torch.full_like(out, want.item())), out.flatten()[:4]
    reversed_keys = attend(query, key.flip(2), value.flip(2), scaling=SCALING)
    assert torch.equal(reversed_keys, torch.zeros_like(out))  # the same keys, the tiny chunk first: lost
