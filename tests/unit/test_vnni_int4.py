"""pipeline.kernels.vnni_int4 and pipeline.kernels.avx2_int4: int4-dynamic's product gives integer arithmetic's
group sums and its fixed float steps, for every row at any row count, thread count and shape, in either kernel and
in torch's reference alike; Int4DynamicLinear runs it, a kernel where built, and gives the same bits every way."""
import pytest
import torch

from pipeline.kernels import avx2_int4, vnni_int4
from pipeline.kernels.int4 import Int4DynamicLinear, group_width, int4_or_int8_dynamic, quantize_groups
from pipeline.kernels.int8 import Int8DynamicLinear, auto_kernel, row_codes
from tests.support.extensions import built_ops
from tests.support.quantized_rows import quiet_and_loud_rows


@pytest.fixture(scope="module", params=["vnni", "avx2"])
def product(request):
    """A kernel's op: (rows, packed, params, channels, bias) -> rows."""
    if request.param == "vnni":
        return built_ops(vnni_int4.EXTENSION, "no AVX-512 VNNI: the kernel is not used on this CPU").vnni_int4_linear
    return built_ops(avx2_int4.EXTENSION, "no AVX2: the kernel is not used on this CPU (torch's ops run it)").avx2_int4_linear


def _kernel(request) -> str:
    """The kernel the test's `product` is, by Int4DynamicLinear's name for it."""
    return request.node.callspec.params["product"]


def _layer(k, out, bias, seed=1):
    """(codes, scale, offset, bias) as Int4DynamicLinear keeps them, from a random float weight."""
    g = torch.Generator().manual_seed(seed)
    codes, params = quantize_groups(torch.randn(out, k, generator=g), group_width(k))
    scale, offset = (params[..., i].float().t().contiguous() for i in (0, 1))
    return codes, scale, offset, (torch.randn(out, generator=g) if bias else None)


def _integer_reference(x, codes, scale, offset, bias):
    """The arithmetic the module docstring states: int64 group sums (exact), then float32 ops one at a time."""
    n, k = x.shape
    out, groups = scale.shape
    q, row_scale = row_codes(x)
    q = q.to(torch.int64).view(n, groups, k // groups)
    sums = torch.einsum("ngw,ogw->gno", q, codes.to(torch.int64).view(out, groups, k // groups))
    qsum = q.sum(dim=2).t()[:, :, None]  # (groups, n, 1)
    acc = torch.zeros(n, out)
    for g in range(groups):
        acc = acc + (scale[:, g] * (sums[g] - 8 * qsum[g]).float() + offset[:, g] * qsum[g].float())
    result = acc * row_scale
    return result if bias is None else result + bias


SHAPES = [(32, 5), (64, 70), (96, 130), (256, 64), (896, 1152), (4864, 64)]


@pytest.mark.parametrize("k, out", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_equals_integer_arithmetic_bit_for_bit(product, k, out, bias):
    codes, scale, offset, b = _layer(k, out, bias)
    packed, params = vnni_int4.pack(codes, scale, offset)
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17):  # eight at once (two blocks at a time), four, the rest
        x = quiet_and_loud_rows(n, k)
        assert torch.equal(product(x, packed, params, out, b), _integer_reference(x, codes, scale, offset, b)), n


@pytest.mark.parametrize("k, out", SHAPES[:4])
def test_torchs_reference_equals_integer_arithmetic_bit_for_bit(k, out):
    codes, scale, offset, b = _layer(k, out, True)
    for n in (1, 3, 8):
        x = quiet_and_loud_rows(n, k)
        assert torch.equal(vnni_int4.reference_product(x, codes, scale, offset, b),
                           _integer_reference(x, codes, scale, offset, b)), n


def test_full_range_group_sums_are_exact(product):
    """Codes of 15 and 0 against row codes of +-127 over 4,864 inputs in groups of 128: every group's sums at
    their extremes, and the float steps on large integers."""
    k, out = 4864, 64
    codes = torch.full((out, k), 15, dtype=torch.int32)
    codes[1::2] = 0
    scale = torch.full((out, k // 128), 0.37).bfloat16().float()  # bfloat16 values, as quantize_groups makes
    offset = torch.full((out, k // 128), -1.3).bfloat16().float()
    x = torch.ones(3, k)
    x[1] = -1.0
    x[2, ::2] = -1.0
    packed, params = vnni_int4.pack(codes, scale, offset)
    expected = _integer_reference(x, codes, scale, offset, None)
    assert torch.equal(product(x, packed, params, out, None), expected)
    assert torch.equal(vnni_int4.reference_product(x, codes, scale, offset, None), expected)


def test_a_rows_result_does_not_depend_on_its_batch_mates_or_the_thread_count(product):
    codes, scale, offset, b = _layer(896, 1152, True)
    packed, params = vnni_int4.pack(codes, scale, offset)
    x = quiet_and_loud_rows(11, 896)
    together = product(x, packed, params, 1152, b)
    alone = torch.cat([product(x[i:i + 1], packed, params, 1152, b) for i in range(11)])
    louder = product(torch.cat([x, 1e6 * torch.ones(1, 896)]), packed, params, 1152, b)[:11]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, packed, params, 1152, b)
        torch.set_num_threads(3)
        three = product(x, packed, params, 1152, b)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(together, other) for other in (alone, louder, one, three))


def test_packing_pads_and_unpacks_to_the_same_codes_scales_and_offsets():
    codes, scale, offset, _ = _layer(96, 70, False)
    packed, params = vnni_int4.pack(codes, scale, offset)
    assert packed.shape == (2, 96 // 8, 4, 16, 4) and packed.dtype == torch.uint8 and packed.is_contiguous()
    assert params.shape == (2, 3, 4, 2, 16) and params.dtype == torch.bfloat16
    back_codes, back_scale, back_offset = vnni_int4.unpack(packed, params, 70)
    assert torch.equal(back_codes.int(), codes) and torch.equal(back_scale, scale) and torch.equal(back_offset, offset)
    # task 1, pair 2, block 0, channel 3: channel 64 + 3's inputs 16..19 low, 20..23 high
    byte = packed[1, 2, 0, 3]
    assert torch.equal((byte & 0x0F).int(), codes[67, 16:20]) and torch.equal((byte >> 4).int(), codes[67, 20:24])
    assert not packed[1, :, 0, 6:].any() and not params[1, :, 0, :, 6:].any()  # channels 70.. are padding


def test_pack_refuses_a_scale_or_offset_that_bfloat16_does_not_hold():
    """The kernel keeps scales and offsets in bfloat16: a value it would round is refused, not changed."""
    codes, scale, offset, _ = _layer(128, 64, False)
    for bad_scale, name in ((scale + 1e-4, "scale"), (scale, "offset")):
        bad_offset = offset if name == "scale" else offset + 1e-4
        with pytest.raises(ValueError, match=f"every {name} must be a bfloat16 value"):
            vnni_int4.pack(codes, bad_scale, bad_offset)


def test_a_wrong_argument_is_refused_by_name(product):
    codes, scale, offset, b = _layer(64, 64, True)
    packed, params = vnni_int4.pack(codes, scale, offset)
    x = torch.randn(2, 64)
    cases = [((x.double(), packed, params, 64, b), "2-d float32 rows"),
             ((torch.randn(2, 72), packed, params, 64, b), "rows of 64 values, not 72"),
             ((x, packed[0], params, 64, b), "a weight packed by vnni_int4.pack"),
             ((x, packed, params.float(), 64, b), r"bfloat16 \(tasks, groups, 4, 2, 16\)"),
             ((x, packed, params, 65, b), "65 channels do not fit 1 packed tasks"),
             ((x, packed, params, 64, b[:3]), "a float32 bias of one value per output channel")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            product(*args)


def test_the_linear_gives_the_kernels_bits_with_it_and_without_it(product, request):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96)
    layer = Int4DynamicLinear(linear)
    assert layer.use_kernel(_kernel(request)) == _kernel(request)
    x = quiet_and_loud_rows(6, 256).view(2, 3, 256)
    with_kernel = layer(x)
    assert layer.use_kernel("torch") == "torch" and layer.kernel_parts() is None  # as where none is built
    without = layer(x)
    codes, scale, offset = vnni_int4.unpack(layer.packed, layer.params, 96)
    expected = _integer_reference(x.view(6, 256), codes, scale, offset, linear.bias.detach()).view(2, 3, 96)
    assert torch.equal(with_kernel, expected) and torch.equal(without, expected)
    assert layer(torch.empty(0, 256)).shape == (0, 96)
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16  # float32 inside, the caller's dtype out


def test_the_variant_keeps_int8_dynamic_where_no_group_divides_the_inputs():
    if auto_kernel(37) is None:
        pytest.skip("no exact int8 product on this CPU (no VNNI): int8-dynamic, and so int4-dynamic, is not offered")
    assert type(int4_or_int8_dynamic(torch.nn.Linear(37, 8))) is Int8DynamicLinear
    assert int4_or_int8_dynamic(torch.nn.Linear(96, 8)).group == 32
    with pytest.raises(ValueError, match="in_features % 32 == 0, got 37"):
        Int4DynamicLinear(torch.nn.Linear(37, 8))


def test_int4_dynamic_runs_it_as_an_op_that_profilers_and_dispatch_modes_see(product, request):
    from profiling.lib.engine_step import ProductRecorder
    layer = Int4DynamicLinear(torch.nn.Linear(64, 64))
    layer.use_kernel(_kernel(request))
    recorder = ProductRecorder()
    with recorder.mode:
        layer(torch.randn(2, 64))
    assert [str(f.overloadpacket.__name__) for f, _, _ in recorder.calls] == [f"{_kernel(request)}_int4_linear"]
