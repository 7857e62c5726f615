"""pipeline.kernels.vnni_int8 and pipeline.kernels.avx2_int8: each one-call int8 product gives integer arithmetic's
sums and the rescale's rounding, for every row at any row count, thread count and shape, over the one packed
layout (Int8DynamicLinear's other kernels give the same bits: tests/unit/test_int8_kernels.py)."""
import pytest
import torch

from pipeline.kernels import avx2_int8, vnni_int8
from pipeline.kernels.int8 import quantize_per_channel, row_codes
from tests.support.extensions import built_ops
from tests.support.quantized_rows import quiet_and_loud_rows


@pytest.fixture(scope="module", params=["vnni", "avx2"])
def product(request):
    """The kernel's op: (rows, packed weight, offsets, scale, bias) -> rows."""
    if request.param == "vnni":
        return built_ops(vnni_int8.EXTENSION, "no AVX-512 VNNI: the kernel is not used on this CPU").vnni_linear
    return built_ops(avx2_int8.EXTENSION, "no AVX2: the kernel is not used on this CPU").avx2_linear


def _layer(k, out, bias, seed=1):
    g = torch.Generator().manual_seed(seed)
    qweight, scale = quantize_per_channel(torch.randn(out, k, generator=g))
    b = torch.randn(out, generator=g) if bias else None
    return qweight, scale, b


def _integer_reference(x, qweight, scale, bias):
    """What the kernel computes, in integer arithmetic (int64 sums: exact) and torch's float32 ops."""
    codes, row_scale = row_codes(x)
    sums = codes.to(torch.int64) @ qweight.to(torch.int64).t()
    out = sums.float() * scale * row_scale
    return out if bias is None else out + bias


@pytest.mark.parametrize("k, out", [(1, 5), (3, 64), (37, 65), (96, 130), (896, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_equals_integer_arithmetic_bit_for_bit(product, k, out, bias):
    qweight, scale, b = _layer(k, out, bias)
    packed, offsets = vnni_int8.pack(qweight)
    for n in (1, 2, 5, 6, 7, 8, 9, 17, 40):  # one pass, and six rows then the rest
        x = quiet_and_loud_rows(n, k)
        assert torch.equal(product(x, packed, offsets, scale, b), _integer_reference(x, qweight, scale, b)), n


def test_no_rows_give_no_rows(product):
    qweight, scale, _ = _layer(16, 8, False)
    assert product(torch.empty(0, 16), *vnni_int8.pack(qweight), scale, None).shape == (0, 8)


def test_full_range_sums_are_exact_where_16_bit_pair_sums_would_saturate(product):
    """Codes of +-127 against weights of +-127 over 4,864 inputs: sums near 78 million, every product at the
    edge of the 16-bit range that a u8 x s8 pair sum (vpmaddubsw) would clip."""
    k = 4864
    qweight = torch.full((64, k), 127, dtype=torch.int8)
    qweight[1::2] = -127
    qweight[2] = -128  # not made by quantize_per_channel, but an int8: |w| is 128 unsigned in avx2's pairs
    scale = torch.full((64,), 1.0)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    codes, _ = row_codes(x)
    assert (codes.double() @ qweight[:1].double().t()).abs().max().item() == k * 127 * 127  # codes at +-127 too
    expected = _integer_reference(x, qweight, scale, None)
    assert torch.equal(product(x, *vnni_int8.pack(qweight), scale, None), expected)


def test_a_rows_result_does_not_depend_on_its_batch_mates_or_the_thread_count(product):
    qweight, scale, b = _layer(896, 1152, True)
    packed, offsets = vnni_int8.pack(qweight)
    x = quiet_and_loud_rows(11, 896)
    together = product(x, packed, offsets, scale, b)
    alone = torch.cat([product(x[i:i + 1], packed, offsets, scale, b) for i in range(11)])
    louder = product(torch.cat([x, 1e6 * torch.ones(1, 896)]), packed, offsets, scale, b)[:11]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, packed, offsets, scale, b)
        torch.set_num_threads(3)
        three = product(x, packed, offsets, scale, b)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(together, other) for other in (alone, louder, one, three))


def test_packing_pads_and_unpacks_to_the_same_weight():
    qweight, _, _ = _layer(37, 65, False)
    packed, offsets = vnni_int8.pack(qweight)
    assert packed.shape == (128 // 64, 40 // 4, 4, 16, 4) and packed.dtype == torch.int8 and packed.is_contiguous()
    assert torch.equal(vnni_int8.unpack(packed, 65, 37), qweight)
    assert torch.equal(offsets[:65], 128 * qweight.sum(dim=1, dtype=torch.int32)) and not offsets[65:].any()
    # group g, quad q, block b holds channels 64g + 16b.. and inputs 4q..: lane-major, as one register's int32
    # sums; a group's four blocks follow one another quad by quad
    assert torch.equal(packed[0, 2, 1, 3], qweight[16 + 3, 8:12])
    assert torch.equal(packed[1, 9, 0, 0, :1], qweight[64, 36:37])


def test_a_wrong_argument_is_refused_by_name(product):
    qweight, scale, b = _layer(32, 64, True)
    packed, offsets = vnni_int8.pack(qweight)
    x = torch.randn(2, 32)
    cases = [((x.double(), packed, offsets, scale, b), "2-d float32 rows"),
             ((torch.randn(2, 36), packed, offsets, scale, b), "rows of 29 to 32 values, not 36"),
             ((x, qweight, offsets, scale, b), "a weight packed by vnni_int8.pack"),
             ((x, packed, offsets[:10], scale, b), "one int32 offset per packed channel"),
             ((x, packed, offsets, scale.double(), b), "one float32 scale per output channel"),
             ((x, packed, offsets, scale, b[:3]), "a float32 bias of one value per output channel")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            product(*args)


def test_int8_dynamic_runs_it_as_an_op_that_profilers_and_dispatch_modes_see(product, request):
    from pipeline.kernels.int8 import Int8DynamicLinear
    from profiling.lib.engine_step import ProductRecorder
    kernel = request.node.callspec.params["product"]
    layer = Int8DynamicLinear(torch.nn.Linear(32, 64), kernel=kernel)
    recorder = ProductRecorder()
    with recorder.mode:
        layer(torch.randn(2, 32))
    assert layer.kernel == kernel
    assert [str(f.overloadpacket.__name__) for f, _, _ in recorder.calls] == [f"{kernel}_linear"]
