"""pipeline.kernels.fused_int8: the C++ quantize and rescale passes give the torch ops' bits, and a
machine where the extension is not built runs the torch ops (its build and load: test_compiled.py)."""
import pytest
import torch

from pipeline.kernels import fused_int8
from pipeline.kernels.fbgemm import fbgemm_is_exact
from pipeline.kernels.int8 import Int8DynamicLinear, row_codes
from tests.support.extensions import built_ops, forget_every_load


@pytest.fixture
def clean_cache(request):
    """fused_ops' and every extension's cached load forgotten before and after: the test points
    TORCH_EXTENSIONS_DIR at an empty folder."""
    fused_int8.fused_ops.cache_clear()
    request.addfinalizer(fused_int8.fused_ops.cache_clear)
    forget_every_load(request)


def test_nothing_built_means_int8_dynamic_runs_the_torch_ops(tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert fused_int8.fused_ops() is None
    torch.manual_seed(0)
    layer = Int8DynamicLinear(torch.nn.Linear(64, 24))
    assert layer(torch.randn(3, 64)).shape == (3, 24)  # the torch ops run instead


@pytest.fixture(scope="module")
def ops():
    """The extension, built here where it is not yet (about 40 s of g++ once per machine and source version)."""
    if not fbgemm_is_exact():
        pytest.skip("fbgemm is not exact on this CPU: int8-dynamic uses torch._int_mm, which is not fused")
    return built_ops(fused_int8.EXTENSION, "no AVX2: the extension is not used on this CPU")


def _rows(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * torch.logspace(-6, 6, n)[:, None]  # quiet rows and loud ones
    if n > 2:
        x[1] = 0  # an all-zero row: the 1e-12 scale floor
        x[2, ::3] = 0.5 * x[2].abs().amax() / 127  # exact halves of the scale: round half to even
    return x


@pytest.mark.slow  # compiles the extension on a machine that has not built it yet
@pytest.mark.parametrize("n, k", [(1, 896), (5, 37), (16, 4864), (3, 17)])
def test_quantize_pass_equals_the_torch_ops_bit_for_bit(ops, n, k):
    x = _rows(n, k)
    anchor = torch.zeros(1, k)
    anchor[0, 0], anchor[0, 1] = -128.0, 127.0
    codes, scale = ops.anchored_row_codes(x, anchor)
    expected_codes, expected_scale = row_codes(x)
    assert torch.equal(codes[0], anchor[0]) and torch.equal(scale, expected_scale)
    assert torch.equal(codes[1:], expected_codes)
    assert torch.equal(ops.anchored_row_codes(x.t().contiguous().t(), anchor)[0], codes)  # any strides


@pytest.mark.slow
@pytest.mark.parametrize("n, m", [(1, 7), (4, 896), (16, 5000)])
def test_rescale_pass_equals_the_torch_ops_bit_for_bit(ops, n, m):
    g = torch.Generator().manual_seed(1)
    sums = torch.randn(n + 1, m, generator=g) * 1e3
    scale, bias = torch.rand(n, 1, generator=g) / 127, torch.randn(m, generator=g)
    assert torch.equal(ops.rescale_rows(sums, 1, scale, bias), sums[1:] * scale + bias)
    assert torch.equal(ops.rescale_rows(sums, 1, scale, None), sums[1:] * scale)
    assert torch.equal(ops.rescale_rows(sums[1:], 0, scale, bias), sums[1:] * scale + bias)


@pytest.mark.slow
@pytest.mark.parametrize("shape, bias", [((896, 128), True), ((4864, 896), False), ((96, 40), True)])
def test_fused_linear_equals_the_unfused_linear_bit_for_bit(ops, shape, bias):
    kernel = "fbgemm"
    torch.manual_seed(3)
    linear = torch.nn.Linear(shape[0], shape[1], bias=bias)
    fused, unfused = Int8DynamicLinear(linear, kernel=kernel), Int8DynamicLinear(linear, kernel=kernel, fused=False)
    assert fused.kernel == unfused.kernel == kernel
    assert fused_int8.fused_ops() is ops  # the fused path is the one under test
    with torch.inference_mode():
        for n in (1, 2, 7, 16, 33):
            x = _rows(n, shape[0], seed=n)
            assert torch.equal(fused(x), unfused(x)), n
        x3 = _rows(12, shape[0]).reshape(3, 4, shape[0])  # (batch, tokens, features), as models call it
        assert torch.equal(fused(x3), unfused(x3)) and fused(x3).shape == (3, 4, shape[1])


@pytest.mark.slow  # compiles the extension on a machine that has not built it yet
def test_the_passes_give_the_same_bits_at_any_thread_count(ops):
    """Rows and column chunks are the OpenMP tasks, each computed whole by one thread."""
    x, anchor = _rows(40, 768), torch.zeros(1, 768)
    sums, scale, bias = torch.randn(41, 9000) * 1e3, torch.rand(40, 1) / 127, torch.randn(9000)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 3):
            torch.set_num_threads(n)
            results.append((*ops.anchored_row_codes(x, anchor), ops.rescale_rows(sums, 1, scale, bias)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert torch.equal(results[0][2], sums[1:] * scale + bias)
