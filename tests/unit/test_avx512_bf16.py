"""pipeline.kernels.avx512_bf16: a bfloat16 product whose rows are summed each in one order, whatever their
batch-mates and the thread count; within a bfloat16 rounding of the exact product; taken by
make_linears_row_invariant for every bfloat16 Linear on the CPU where it is built, oneDNN's where not."""
import pytest
import torch

from pipeline.cpu_features import cpu_packs_bf16
from pipeline.kernels import avx512_bf16
from pipeline.kernels.batch_invariance import PackedBf16Linear, RowInvariantLinear, make_linears_row_invariant
from tests.support.extensions import built_ops, forget_every_load


@pytest.fixture(scope="module")
def product():
    """The kernel's op: (rows, packed weight, channels, bias) -> rows."""
    return built_ops(avx512_bf16.EXTENSION, "no AVX-512 BF16: the kernel is not used on this CPU").bf16_linear


def _layer(k: int, out: int, bias: bool, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, k, generator=g).bfloat16()
    return weight, (torch.randn(out, generator=g).bfloat16() if bias else None)


def _rows(n: int, k: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("k, out", [(1, 5), (2, 64), (7, 65), (96, 130), (896, 64), (4864, 100)])
def test_pack_then_unpack_is_the_weight(k, out):
    weight, _ = _layer(k, out, False)
    packed = avx512_bf16.pack(weight)
    assert packed.shape == (-(-out // 48), -(-k // 2), 3, 16, 2)
    assert torch.equal(avx512_bf16.unpack(packed, out, k), weight)


@pytest.mark.parametrize("k, out", [(1, 5), (7, 65), (96, 130), (896, 64), (4864, 100)])
@pytest.mark.parametrize("bias", [False, True])
def test_each_value_is_the_exact_product_rounded_to_bfloat16_or_its_neighbour(product, k, out, bias):
    """The float32 sums of exact bfloat16 products are within a few float32 roundings of the exact sum: rounded
    once to bfloat16 they give the exact product's bfloat16 or, where it lies near a rounding boundary, the one
    beside it."""
    weight, b = _layer(k, out, bias)
    x = _rows(9, k)
    got = product(x, avx512_bf16.pack(weight), out, b)
    exact = x.double() @ weight.double().t() + (0 if b is None else b.double())
    nearest = exact.float().bfloat16()
    ulp = (nearest.float().abs() * 2.0 ** -7).clamp_min(2.0 ** -126)
    assert got.dtype == torch.bfloat16 and got.shape == (9, out)
    assert ((got.float() - nearest.float()).abs() <= ulp).all()
    assert (got == nearest).float().mean() > 0.95


@pytest.mark.parametrize("k, out", [(7, 65), (896, 1152), (4864, 128)])
def test_a_row_gets_the_same_bits_alone_and_among_any_rows_at_any_thread_count(product, k, out):
    weight, b = _layer(k, out, True)
    packed = avx512_bf16.pack(weight)
    x = _rows(70, k)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([product(x[i:i + 1], packed, out, b) for i in range(x.shape[0])])
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 70):
                for start in (0, 1):
                    got = product(x[start:start + rows], packed, out, b)
                    assert torch.equal(got, alone[start:start + rows]), (count, rows, start)
    finally:
        torch.set_num_threads(threads)


def test_rows_that_are_a_view_give_the_contiguous_rows_bits(product):
    weight, b = _layer(64, 70, True)
    packed = avx512_bf16.pack(weight)
    wide = _rows(6, 128)
    assert torch.equal(product(wide[:, ::2], packed, 70, b), product(wide[:, ::2].contiguous(), packed, 70, b))


def test_no_rows_give_no_rows(product):
    weight, _ = _layer(16, 8, False)
    assert product(torch.empty(0, 16, dtype=torch.bfloat16), avx512_bf16.pack(weight), 8, None).shape == (0, 8)


@pytest.mark.parametrize("case, message", [
    ("float32 rows", "2-d bfloat16 rows"),
    ("plain weight", "a weight packed by avx512_bf16.pack"),
    ("wrong width", "rows of 63 to 64 values, not 62"),
    ("too many channels", "97 output channels from a weight packed for 96"),
    ("float32 bias", "a bfloat16 bias of one value per output channel"),
    ("short bias", "a bfloat16 bias of one value per output channel"),
])
def test_wrong_arguments_are_refused_naming_the_rule(product, case, message):
    weight, b = _layer(64, 60, True)
    packed = avx512_bf16.pack(weight)
    x = _rows(2, 64)
    args = {"float32 rows": (x.float(), packed, 60, b), "plain weight": (x, weight, 60, b),
            "wrong width": (_rows(2, 62), packed, 60, b), "too many channels": (x, packed, 97, None),
            "float32 bias": (x, packed, 60, b.float()), "short bias": (x, packed, 60, b[:30])}[case]
    with pytest.raises(RuntimeError, match=message):
        product(*args)


def test_bfloat16_linears_take_the_kernel_and_float32_ones_onednn(product):
    model = torch.nn.Sequential(torch.nn.Linear(96, 130).bfloat16(), torch.nn.Linear(130, 8))
    assert make_linears_row_invariant(model) == 2
    assert type(model[0]) is PackedBf16Linear and type(model[1]) is RowInvariantLinear
    x = _rows(3, 96)
    with torch.no_grad(), torch.profiler.profile() as recorded:
        got = model[0](x.view(3, 1, 96))
    assert got.shape == (3, 1, 130) and got.dtype == torch.bfloat16
    assert any(event.name.endswith("::bf16_linear") for event in recorded.events())  # registered: profilers see it


@pytest.mark.skipif(not cpu_packs_bf16(), reason="oneDNN packs no bfloat16 weight on this CPU")
def test_where_the_kernel_is_not_built_bfloat16_linears_stay_with_onednn(tmp_path, monkeypatch, request):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    forget_every_load(request)
    assert avx512_bf16.EXTENSION.ops() is None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 130).bfloat16())
    make_linears_row_invariant(model)
    assert type(model[0]) is RowInvariantLinear
    assert model[0](_rows(3, 96)).shape == (3, 130)
