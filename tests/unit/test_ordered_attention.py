"""pipeline.kernels.ordered_attention: the C++ kernel computes exactly the sums its docstring names (a torch
twin of every operation, in the same order, gives the same bits), at any thread count; its arguments are
checked. Row invariance (alone, padded, in pieces) is tested with the other kernels in test_chunked_attention.py."""
import pytest
import torch

from pipeline.kernels.ordered_attention import EXTENSION, ordered_attention

pytestmark = pytest.mark.skipif(EXTENSION.ops() is None, reason="the ordered attention is not built for this CPU")
F32 = torch.float32


def f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=F32)


def exp_twin(x: torch.Tensor) -> torch.Tensor:
    """The kernel's exp for x <= 0, one float32 operation at a time."""
    big = f32(12582912.0)
    t = torch.where(x < -87.0, f32(-87.0), x)
    n = (t * f32(1.44269504088896341) + big) - big
    r = t - n * f32(0.693359375)
    r = r - n * f32(-2.12194440e-4)
    p = torch.full_like(r, 1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f32(c)
    p = p * (r * r) + r
    p = p + f32(1.0)
    scale = ((n.to(torch.int32) + 127) << 23).view(F32)
    return torch.where(x < -87.0, f32(0.0), p * scale)


def twin(query, key, value, mask, scaling, is_causal, lengths):
    """ordered_attention in torch's elementwise float32 operations, each sum in the kernel's order."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    q = query.float().view(rows, kv_heads, heads // kv_heads, queries, 1, dim)
    k, v = key.float()[:, :, None, None], value.float()  # k: (rows, kv heads, 1, 1, keys, dim)
    lane = torch.zeros(*q.shape[:4], keys, 8)
    for d in range(0, dim, 8):
        width = min(8, dim - d)
        lane[..., :width] = lane[..., :width] + q[..., d:d + width] * k[..., d:d + width]
    l_ = lane.unbind(-1)
    scores = (((l_[0] + l_[4]) + (l_[2] + l_[6])) + ((l_[1] + l_[5]) + (l_[3] + l_[7]))) * f32(scaling)
    limit = lengths.clamp(0, keys) if lengths is not None else torch.full((rows,), keys)
    end = limit[:, None].expand(rows, queries)
    if is_causal:
        end = (limit[:, None] - queries + torch.arange(queries)[None, :] + 1).clamp(min=0)
    sees = torch.arange(keys)[None, None, :] < end[:, :, None]  # (rows, queries, keys)
    if mask is not None:
        sees = sees & mask.expand(rows, 1, queries, keys)[:, 0]
    sees = sees[:, None, None]  # (rows, 1, 1, queries, keys)
    scores = scores.masked_fill(~sees, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = torch.where(sees & (top > float("-inf")), exp_twin(scores - top), f32(0.0))
    total = torch.zeros(weights.shape[:-1])
    sums = torch.zeros(*weights.shape[:-1], dim)
    for j in range(keys):  # key after key; a key of weight 0 is skipped
        p = weights[..., j]
        taken = p != 0
        total = torch.where(taken, total + p, total)
        sums = torch.where(taken[..., None], sums + p[..., None] * v[:, :, None, None, j], sums)
    out = torch.where(total[..., None] > 0, sums / total[..., None], f32(0.0))
    return out.view(rows, heads, queries, dim).to(query.dtype)


def inputs(rows, heads, kv_heads, queries, keys, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = (3 * torch.randn(rows, heads, queries, dim, generator=g)).to(dtype)
    # a cache with spare columns: the kernel reads keys and values in place, any strides but the head size's
    key = torch.randn(rows, kv_heads, keys + 5, dim, generator=g).to(dtype)[:, :, :keys]
    value = torch.randn(rows, kv_heads, keys + 5, dim, generator=g).to(dtype)[:, :, :keys]
    return query, key, value


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 32, 20])  # the unrolled sizes and one that is neither (a partial lane)
@pytest.mark.parametrize("case", ["decode", "causal", "mask", "lengths"])
def test_the_kernel_computes_each_querys_keys_in_order_bit_for_bit(dtype, dim, case):
    rows, heads, kv_heads, keys = 3, 6, 2, 45
    queries = 1 if case in ("decode", "lengths") else 11  # 11: one full block of 8 queries and a part
    query, key, value = inputs(rows, heads, kv_heads, queries, keys, dim, dtype)
    mask = lengths = None
    if case == "mask":  # random holes, a query that sees nothing, left padding (row 2 starts at column 9)
        mask = torch.rand(rows, 1, queries, keys, generator=torch.Generator().manual_seed(1)) < 0.7
        mask[0, 0, 3] = False
        mask[2, :, :, :9] = False
    if case == "lengths":
        lengths = torch.tensor([45, 1, 30])
    causal = case in ("causal", "lengths")
    got = ordered_attention(query, key, value, mask, scaling=dim ** -0.5, is_causal=causal, lengths=lengths)
    assert got.shape == query.shape and got.is_contiguous()
    assert same_bits(got, twin(query, key, value, mask, dim ** -0.5, causal, lengths))
    if case == "mask":
        assert not got[0, :, 3].any()  # saw nothing: zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_steps_shape_over_several_blocks_of_keys_bit_for_bit(dtype):
    """Qwen2.5-0.5B's heads at one query a row, each row's own length: key blocks of eight and tiles of values
    cut at other places in every row (lengths 1 to 300, past a tile of 64 keys and the keys asked for ahead)."""
    query, key, value = inputs(5, 14, 2, 1, 300, 64, dtype, seed=3)
    lengths = torch.tensor([300, 1, 64, 65, 203])
    got = ordered_attention(query, key, value, scaling=0.125, is_causal=True, lengths=lengths)
    assert same_bits(got, twin(query, key, value, None, 0.125, True, lengths))


def test_far_below_the_top_a_weight_is_0_and_its_key_is_skipped():
    """Scores spread over a wide range: weights underflow (exp below -87 is 0) and their keys add nothing."""
    query, key, value = inputs(2, 4, 2, 3, 70, 64, torch.float32, seed=5)
    key = key * torch.linspace(0.1, 40, 70)[:, None]  # some scores hundreds below the top
    got = ordered_attention(query, key, value, scaling=0.125, is_causal=True)
    assert same_bits(got, twin(query, key, value, None, 0.125, True, None))
    scores = torch.einsum("rhqd,rhkd->rhqk", query.view(2, 2, 6, 64).float(), key.float()) * 0.125
    assert (scores.amax(-1, keepdim=True) - scores > 87).any()  # the case is reached


def test_the_threads_share_tasks_without_changing_a_bit():
    query, key, value = inputs(4, 14, 2, 19, 300, 64, torch.bfloat16, seed=2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ordered_attention(query, key, value, scaling=0.125, is_causal=True)
        torch.set_num_threads(3)
        three = ordered_attention(query, key, value, scaling=0.125, is_causal=True)
    finally:
        torch.set_num_threads(threads)
    assert same_bits(one, three)


def test_the_kernel_says_which_argument_is_wrong():
    query, key, value = inputs(2, 4, 2, 1, 10, 16, torch.float32)
    with pytest.raises(RuntimeError, match="one dtype"):
        ordered_attention(query, key.to(torch.bfloat16), value, scaling=0.25)
    with pytest.raises(RuntimeError, match="bool mask"):
        ordered_attention(query, key, value, torch.ones(2, 1, 1, 10), scaling=0.25)
    with pytest.raises(RuntimeError, match="int64 lengths"):
        ordered_attention(query, key, value, scaling=0.25, lengths=torch.tensor([3, 4], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="shapes do not match"):
        ordered_attention(query, key[:, :1].expand(2, 3, 10, 16), value[:, :1].expand(2, 3, 10, 16), scaling=0.25)
