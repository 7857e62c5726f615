"""int4-weight's Linear (pipeline/kernels/int4.py): group-wise 4-bit weights close to the float ones, a row's
bits the same alone and among any number of rows at any thread count, the kernel's reading of the packing
checked at load, and the shapes it cannot take left to int8 weight-only."""
from __future__ import annotations

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.kernels import int4
from pipeline.kernels.int4 import Int4WeightLinear, dequantize, int4_group, int4_or_int8_weight, quantize_groups
from pipeline.kernels.int8 import Int8WeightLinear
from pipeline.precision import model_nbytes

# Qwen2.5-0.5B's Linear shapes (in, out): q/o, k/v, gate/up, down; and a toy one with 64-wide groups.
SHAPES = [(896, 896), (896, 128), (896, 4864), (4864, 896), (64, 48)]


def _linear(k: int, n: int, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)


def test_the_group_width_is_the_widest_the_input_takes_and_none_where_the_kernel_cannot():
    assert int4_group(896, 4864) == 128 and int4_group(4864, 896) == 128
    assert int4_group(64, 48) == 64 and int4_group(96, 16) == 32
    assert int4_group(896, 5) is None and int4_group(48, 16) is None  # 5 outputs; 48 inputs in no group width
    assert isinstance(int4_or_int8_weight(_linear(896, 5)), Int8WeightLinear)  # a label head
    assert isinstance(int4_or_int8_weight(_linear(896, 32)), Int4WeightLinear)
    with pytest.raises(ValueError, match="out_features % 16"):
        Int4WeightLinear(_linear(896, 5))


def test_quantized_weights_lie_within_half_a_step_of_the_float_ones_and_use_all_sixteen_codes():
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    codes, params = quantize_groups(weight, 128)
    assert codes.dtype == torch.int32 and params.shape == (2, 64, 2) and params.dtype == torch.bfloat16
    assert codes.min() == 0 and codes.max() == 15
    step = params[..., 0].float().t().repeat_interleave(128, dim=1)
    error = (dequantize(codes, params, 128) - weight).abs()
    assert (error <= step / 2 * 1.02 + 1e-6).all()  # round to nearest, the bfloat16 offset's rounding aside
    assert error.max() > step.min() / 8  # quantized: not the float weight by accident


@pytest.mark.parametrize("k, n", SHAPES)
def test_the_int4_linear_is_close_to_the_float_one(k, n):
    linear = _linear(k, n)
    x = torch.randn(3, 5, k).to(torch.bfloat16)
    expected = linear.float()(x.float())
    got = Int4WeightLinear(_linear(k, n))(x)
    assert got.shape == expected.shape and got.dtype == torch.bfloat16
    rel = ((got.float() - expected).norm() / expected.norm()).item()
    assert 1e-3 < rel < 0.15  # 4 bits: about 8 % on random weights, yet not the float path
    assert Int4WeightLinear(_linear(k, n, bias=False))(x[:0]).shape == (0, 5, n)


@pytest.mark.parametrize("k, n", SHAPES)
def test_a_rows_bits_alone_equal_its_bits_among_any_number_of_rows_at_1_2_and_8_threads(k, n):
    layer = Int4WeightLinear(_linear(k, n))
    x = torch.randn(1200, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for count in (1, 2, 8):
                torch.set_num_threads(count)
                alone = torch.cat([layer(x[i:i + 1]) for i in range(64)])
                for rows in [*range(2, 65), 600, 1100]:
                    for start in (0, 3) if rows in (5, 17, 64, 600) else (0,):
                        got = layer(x[start:start + rows])[:64 - start]
                        assert torch.equal(got, alone[start:start + got.shape[0]]), (count, rows, start)
    finally:
        torch.set_num_threads(threads)


def test_a_quarter_of_bfloat16s_bytes():
    plain = _linear(896, 4864)
    assert model_nbytes(Int4WeightLinear(plain)) < 0.3 * model_nbytes(plain)


def test_a_kernel_that_reads_the_packing_otherwise_is_detected_and_refused(monkeypatch, request):
    real = int4.packed_product
    int4.int4_is_exact.cache_clear()
    request.addfinalizer(int4.int4_is_exact.cache_clear)
    assert int4.int4_is_exact() is True  # this torch's kernel, as the module reads it
    # codes read without their offset of 8, as a kernel of another int4 convention would
    monkeypatch.setattr(int4, "packed_product", lambda rows, packed, group, params: real(
        rows, packed, group, params) + 8 * (rows.float() @ params[..., 0].float().repeat_interleave(
            group, 0)).to(torch.bfloat16))
    int4.int4_is_exact.cache_clear()
    assert int4.int4_is_exact() is False
    with pytest.raises(ConfigError, match="int4-weight needs torch's packed int4 product"):
        Int4WeightLinear(_linear(64, 48))
