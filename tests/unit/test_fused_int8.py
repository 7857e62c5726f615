"""pipeline.kernels.fused_int8: the C++ quantize and rescale passes give the torch ops' bits, and a
machine where the extension is not built runs the torch ops without compiling anything."""
import pytest
import torch

from pipeline.kernels import fused_int8
from pipeline.kernels.fbgemm import fbgemm_is_exact
from pipeline.kernels.int8 import Int8DynamicLinear, row_codes


@pytest.fixture
def clean_cache(request):
    fused_int8.fused_ops.cache_clear()
    request.addfinalizer(fused_int8.fused_ops.cache_clear)


def test_nothing_built_means_no_fused_ops_and_no_compiler_run(tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert fused_int8.fused_ops() is None
    assert list(tmp_path.iterdir()) == []  # looked, built nothing
    torch.manual_seed(0)
    layer = Int8DynamicLinear(torch.nn.Linear(64, 24))
    assert layer(torch.randn(3, 64)).shape == (3, 24)  # the torch ops run instead


def test_a_library_that_does_not_load_means_no_fused_ops(tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = fused_int8.build_directory()
    folder.mkdir(parents=True)
    (folder / f"{fused_int8.NAME}.so").write_bytes(b"not a shared library")  # an interrupted copy, say
    assert fused_int8.fused_ops() is None


def test_the_build_folder_names_the_source_version_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = fused_int8.build_directory()
    assert folder.parent.parent == tmp_path and folder.name == fused_int8.NAME
    assert torch.__version__ in folder.parent.name


@pytest.fixture(scope="module")
def ops():
    """The extension, built here where it is not yet (about 40 s of g++ once per machine and source version)."""
    if not fbgemm_is_exact():
        pytest.skip("fbgemm is not exact on this CPU: int8-dynamic uses torch._int_mm, which is not fused")
    if not fused_int8._cpu_supported():
        pytest.skip("no AVX2: the extension is not used on this CPU")
    if fused_int8.fused_ops() is None:
        fused_int8.build()
    return fused_int8.fused_ops()


def _compiler_refused(monkeypatch):
    from torch.utils import cpp_extension

    def refuse(*args, **kwargs):  # what the image's numeric user meets: no compiler, a root-owned cache
        raise PermissionError("the build lock cannot be taken")
    monkeypatch.setattr(cpp_extension, "load_inline", refuse)


def test_a_cpu_without_avx2_builds_nothing(tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(fused_int8, "_cpu_supported", lambda: False)
    _compiler_refused(monkeypatch)
    assert "nothing to build" in fused_int8.build()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # needs the built extension (compiled by `ops` where it is not yet)
def test_where_it_is_built_build_needs_neither_compiler_nor_lock(ops, monkeypatch):
    _compiler_refused(monkeypatch)
    assert fused_int8.build() == f"{fused_int8.NAME} is built in {fused_int8.build_directory()}"
    assert fused_int8.fused_ops() is ops
    # Nor loading it (which imports torch): the library is found in the installed torch's folder.
    with monkeypatch.context() as patched:
        patched.setattr(fused_int8, "fused_ops", lambda: pytest.fail("build() loaded the library"))
        assert fused_int8.build() == f"{fused_int8.NAME} is built in {fused_int8.build_directory()}"


def test_the_installed_torch_names_the_same_folder_as_the_imported_one():
    assert fused_int8.build_directory(fused_int8._installed_torch_version()) == fused_int8.build_directory()


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
