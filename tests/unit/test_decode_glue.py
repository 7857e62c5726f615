"""pipeline.kernels.decode_glue: each call gives, bit for bit, what the torch ops it replaces give (the decode
step against the model's forward with it and without it: tests/unit/test_qwen2_step.py)."""
import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from pipeline.kernels import decode_glue
from pipeline.kernels.batch_invariance import make_norms_row_invariant
from tests.support.extensions import built_ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def ops():
    return built_ops(decode_glue.EXTENSION, "no AVX2: the decode step runs torch's ops on this CPU")


def _rotary(rows, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(rows, 1, dim // 2, generator=g) * 3000
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    half = dim // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, heads, kv_heads, dim", [(1, 14, 2, 64), (5, 4, 2, 8), (3, 2, 1, 20)])
def test_rotate_and_store_gives_the_torch_ops_bits_and_writes_each_kv_head_at_its_row(ops, dtype, rows, heads,
                                                                                     kv_heads, dim):
    g = torch.Generator().manual_seed(1)
    # q, k and v side by side in one product's rows (the fused Linear's output), split as the step splits it
    fused = (torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=g) * 30).to(dtype)
    qk = fused[:, :(heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
    v = fused[:, (heads + kv_heads) * dim:]
    cos, sin = _rotary(rows, dim, dtype)
    slots = 40
    written = torch.randperm(slots, generator=g)[:rows * kv_heads]
    keys, values = torch.zeros(slots, dim, dtype=dtype), torch.zeros(slots, dim, dtype=dtype)
    expected_keys, expected_values = keys.clone(), values.clone()
    rotated = (qk * cos).add_(torch.roll(qk, dim // 2, -1).mul_(sin))  # the step's torch ops
    expected_keys.index_copy_(0, written, rotated[:, heads:].reshape(-1, dim))
    expected_values.index_copy_(0, written, v.reshape(-1, dim))
    op = decode_glue.EXTENSION.registered("rotate_and_store")
    q = op(qk, v, cos, sin, keys, values, written, heads)
    assert q.shape == (rows, heads, 1, dim) and q.is_contiguous()
    assert torch.equal(q, rotated[:, :heads].unsqueeze(2))
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_rotate_and_store_rounds_ties_overflow_and_nans_as_torchs_bfloat16_does(ops):
    # cos and sin of ones: each output is rounded(x[d]) + rounded(x[d + half]), a float sum of two bfloat16 values
    # stored in bfloat16: ties (to even, down and up), sums past the largest bfloat16 (to infinity), infinities
    # and NaNs of either sign, subnormals
    big, tiny, nan, inf = 3.3895e38, 1e-40, float("nan"), float("inf")
    pairs = [(1.0, 2 ** -8), (1.0 + 2 ** -7, 2 ** -8), (-1.0, -2 ** -8), (big, big / 256), (big, 2 ** 119),
             (inf, -inf), (nan, 1.0), (-nan, 1.0), (inf, 1.0), (tiny, tiny), (-0.0, 0.0), (3.0, -3.0),
             (1.0, 2 ** -9), (-big, -big / 256), (2 ** -133, 2 ** -133), (65504.0, 1.0)]
    half = len(pairs)
    x = torch.tensor([p[0] for p in pairs] + [p[1] for p in pairs]).to(torch.bfloat16)
    qk = torch.stack([x, x.flip(0)]).view(1, 2, 2 * half)  # a query head and a key head
    v = torch.zeros(1, 2 * half, dtype=torch.bfloat16)
    cos = torch.ones(1, 1, 2 * half, dtype=torch.bfloat16)
    keys, values = torch.zeros(4, 2 * half, dtype=torch.bfloat16), torch.zeros(4, 2 * half, dtype=torch.bfloat16)
    op = decode_glue.EXTENSION.registered("rotate_and_store")
    q = op(qk, v, cos, cos.clone(), keys, values, torch.tensor([2]), 1)
    rotated = (qk * cos).add_(torch.roll(qk, half, -1).mul_(cos))  # the step's torch ops
    for got, expected in ((q.flatten(), rotated[0, 0]), (keys[2], rotated[0, 1])):
        # A NaN is a NaN (torch's vector loops store 0xFFFF, its scalar ones and c10 0x7FC0); every other value
        # the same bits
        nan = expected.isnan()
        assert torch.equal(got.isnan(), nan) and nan.sum() == 6
        assert torch.equal(got[~nan].view(torch.int16), expected[~nan].view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(1, 896), (2, 896), (7, 40), (3, 13)])
def test_rms_norm_gives_the_norms_torch_ops_bits(ops, dtype, rows, width):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(rows, width, generator=g) * torch.logspace(-3, 3, rows)[:, None]).to(dtype)
    if rows > 2:
        x[1] = 0  # a zero row: rsqrt(eps)
    weight = torch.randn(width, generator=g).to(dtype)
    eps = 1e-6
    h = x.to(torch.float32)
    expected = (h * h.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).to(dtype).mul_(weight)  # the step's torch ops
    module = Qwen2RMSNorm(width, eps=eps).to(dtype)
    module.weight.data.copy_(weight)
    make_norms_row_invariant(module)
    with torch.no_grad():
        assert torch.equal(module(x), expected)  # the model's own norm
    op = decode_glue.EXTENSION.registered("rms_norm")
    assert torch.equal(op(x, weight, eps), expected)
    wide = torch.zeros(rows, width + 5, dtype=dtype)
    wide[:, :width] = x  # rows of a wider tensor: any row stride
    assert torch.equal(op(wide[:, :width], weight, eps), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_add_rms_norm_adds_in_place_then_gives_the_norms_bits(ops, dtype, rows):
    g = torch.Generator().manual_seed(3)
    hidden = (torch.randn(rows, 896, generator=g) * 40).to(dtype)
    delta = (torch.randn(rows, 896, generator=g) * 3).to(dtype)
    weight = torch.randn(896, generator=g).to(dtype)
    expected_hidden = hidden.clone().add_(delta)  # the step's torch ops
    expected = decode_glue.EXTENSION.registered("rms_norm")(expected_hidden, weight, 1e-6)
    got = decode_glue.EXTENSION.registered("add_rms_norm")(hidden, delta, weight, 1e-6)
    assert torch.equal(hidden, expected_hidden) and torch.equal(got, expected)  # the stream itself updated


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(1, 4864), (3, 40), (2, 7)])
def test_silu_mul_gives_silu_of_the_gate_times_the_up_half(ops, dtype, rows, width):
    g = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(rows, 2 * width, generator=g) * 6).to(dtype)
    gate, up = gate_up.split(width, dim=-1)
    expected = torch.nn.functional.silu(gate).mul_(up)  # the step's torch ops
    got = decode_glue.EXTENSION.registered("silu_mul")(gate_up)
    assert got.shape == (rows, width) and torch.equal(got, expected)
    with pytest.raises(RuntimeError, match=r"gate_up \(rows, 2 x width\)"):
        decode_glue.EXTENSION.registered("silu_mul")(gate_up[:, :-1])


def test_a_wrong_argument_is_refused_by_name(ops):
    dim, heads = 8, 2
    qk, v = torch.randn(2, 3, dim), torch.randn(2, dim)
    cos, sin = _rotary(2, dim, torch.float32)
    keys, values = torch.zeros(10, dim), torch.zeros(10, dim)
    written = torch.tensor([0, 1])
    op = decode_glue.EXTENSION.registered("rotate_and_store")
    cases = [((qk, v, cos, sin, keys, values, written, 3), "qk \\(rows, heads \\+ kv heads"),
             ((qk, v, cos, sin, keys, values, torch.tensor([0, 10]), heads), "row 10 outside the buffers"),
             ((qk, v, cos, sin, keys, values, written.int(), heads), "int64 rows to write"),
             ((qk, v.double(), cos, sin, keys, values, written, heads), "one dtype"),
             ((qk, v, cos[:1], sin, keys, values, written, heads), "contiguous cos and sin")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)
    norm = decode_glue.EXTENSION.registered("rms_norm")
    with pytest.raises(RuntimeError, match="a weight of x's dtype, one value per column"):
        norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="each row contiguous"):
        norm(torch.randn(8, 2).t(), torch.ones(8), 1e-6)
