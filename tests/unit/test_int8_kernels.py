"""int8-dynamic's packed kernels (the project's VNNI and AVX2 kernels, fbgemm) give torch._int_mm's bits, so they may
replace it; fbgemm is dropped for _int_mm where a check at load finds it inexact, and a kernel this machine
cannot run for the next one."""
import pytest
import torch

from pipeline.kernels import avx2_int8, vnni_int8
from pipeline.kernels.fbgemm import AnchoredFbgemm, fbgemm_is_exact
from pipeline.kernels.int8 import Int8DynamicLinear, auto_kernel
from pipeline.precision import model_nbytes


def _vnni_runs() -> bool:
    return vnni_int8.EXTENSION.ops() is not None


def _avx2_runs() -> bool:
    return avx2_int8.EXTENSION.ops() is not None


# Each packed kernel and the check that says this CPU may use it.
KERNELS = {"vnni": _vnni_runs, "fbgemm": fbgemm_is_exact, "avx2": _avx2_runs}


@pytest.fixture(params=list(KERNELS))
def kernel(request):
    if not KERNELS[request.param]():
        pytest.skip(f"{request.param} is not used on this CPU (no VNNI, or for vnni no AVX-512, or no build)")
    return request.param


def _pair(kernel, in_features=96, out_features=40, bias=True):
    from pipeline.kernels.int8 import int_mm_is_exact
    if not int_mm_is_exact():
        pytest.skip("torch._int_mm does not sum exactly here (oneDNN without VNNI): no _int_mm to compare with")
    torch.manual_seed(3)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    return Int8DynamicLinear(linear, kernel=kernel), Int8DynamicLinear(linear, kernel="int_mm")


def _rows(n, in_features=96):
    # rows of very different magnitudes: a per-tensor scale would let the loud ones crush the quiet ones
    return torch.randn(n, in_features) * torch.logspace(-3, 3, n)[:, None]


@pytest.mark.parametrize("fused", [True, False])
def test_the_packed_path_equals_int_mm_bit_for_bit_at_every_row_count(kernel, fused):
    packed, plain = _pair(kernel)
    packed.fused = fused
    assert (packed.kernel, plain.kernel) == (kernel, "int_mm")
    with torch.inference_mode():
        for n in (1, 2, 3, 16, 17, 64, 300):
            x = _rows(n)
            assert torch.equal(packed(x), plain(x)), n
            assert torch.equal(packed.multiply(x), plain(x)), n  # the decode step's call over 2-d float32 rows
        x3 = _rows(12).reshape(3, 4, 96)  # (batch, tokens, features) as the models call it
        assert torch.equal(packed(x3), plain(x3)) and packed(x3).shape == (3, 4, 40)


def test_a_rows_result_does_not_depend_on_its_batch_mates(kernel):
    packed, _ = _pair(kernel, bias=False)
    x = _rows(9)
    with torch.inference_mode():
        together = packed(x)
        alone = torch.cat([packed(x[i:i + 1]) for i in range(9)])
        louder = packed(torch.cat([x, 1e6 * torch.ones(1, 96)]))[:9]  # an outlier joins the batch
    assert torch.equal(alone, together) and torch.equal(louder, together)


def test_the_packed_copy_replaces_the_plain_weight(kernel):
    packed, plain = _pair(kernel)
    assert packed.qweight is None and "qweight" not in dict(packed.named_buffers())
    # counted once, as the plain int8 was; vnni's and avx2's copy with its padding (40 channels to 64) and offsets
    extra = (64 - 40) * 96 + 64 * 4 if kernel in ("vnni", "avx2") else 0
    assert model_nbytes(packed) == model_nbytes(plain) + extra
    assert torch.equal(packed.int8_weight(), plain.int8_weight())


def test_a_benchmark_switches_kernels_keeping_each_copy_and_the_bits(kernel):
    packed, plain = _pair(kernel)
    x = _rows(5)
    expected = plain(x)
    assert packed.use_kernel("int_mm", keep=True) == "int_mm" and torch.equal(packed(x), expected)
    assert packed.use_kernel(kernel, keep=True) == kernel and torch.equal(packed(x), expected)
    assert packed.qweight is not None  # int_mm's copy kept beside the packed one
    assert packed.use_kernel(kernel) == kernel and packed.qweight is None  # the others dropped
    assert torch.equal(packed(x), expected) and torch.equal(packed.int8_weight(), plain.int8_weight())


def _kernel_taken(kernel: str = "auto") -> str | None:
    """The kernel an Int8DynamicLinear of 32 inputs takes here, None where int8-dynamic is refused."""
    from pipeline.config import ConfigError
    try:
        return Int8DynamicLinear(torch.nn.Linear(32, 8), kernel=kernel).kernel
    except ConfigError:
        return None


def test_auto_prefers_vnni_then_fbgemm_then_avx2_then_int_mm():
    from pipeline.kernels.int8 import int_mm_is_exact
    expected = ("vnni" if _vnni_runs() else "fbgemm" if fbgemm_is_exact() else "avx2" if _avx2_runs()
                else "int_mm" if int_mm_is_exact() else None)  # no exact kernel (no VNNI, no build): refused
    assert _kernel_taken() == expected == auto_kernel(32)


def test_a_kernel_this_machine_cannot_run_gives_way_to_the_next(monkeypatch):
    monkeypatch.setattr(vnni_int8.EXTENSION, "ops", lambda: None)  # as where it is not built, or no AVX-512 VNNI
    assert _kernel_taken("vnni") == auto_kernel(32) != "vnni"


def test_a_cpu_without_vnni_multiplies_with_the_avx2_kernel_or_refuses_naming_its_build(monkeypatch):
    """As on an AVX2-only CPU: no VNNI kernel, fbgemm's and _int_mm's pair sums saturate; the AVX2 kernel sums
    exactly, with _int_mm's bits where this machine can check them; without its build int8-dynamic is refused."""
    from pipeline.config import ConfigError
    from pipeline.kernels import int8
    if not _avx2_runs():
        pytest.skip("the AVX2 int8 kernel is not built here")
    linear = torch.nn.Linear(96, 40)
    x = _rows(9)
    with torch.inference_mode():
        expected = Int8DynamicLinear(linear, kernel="auto")(x)  # whichever exact kernel this machine has first
        monkeypatch.setattr(vnni_int8.EXTENSION, "ops", lambda: None)
        monkeypatch.setattr(int8, "fbgemm_is_exact", lambda: False)
        monkeypatch.setattr(int8, "int_mm_is_exact", lambda: False)
        layer = Int8DynamicLinear(linear, kernel="auto")
        assert layer.kernel == "avx2" and auto_kernel(96) == "avx2" and torch.equal(layer(x), expected)
        monkeypatch.setattr(avx2_int8.EXTENSION, "ops", lambda: None)
        with pytest.raises(ConfigError, match=r"AVX2 kernel is not built \(python -m pipeline.kernels.compiled\)"):
            Int8DynamicLinear(linear, kernel="auto")


def test_an_inexact_kernel_is_detected_and_another_used(monkeypatch, request):
    name, check, packed_class = "fbgemm", fbgemm_is_exact, AnchoredFbgemm
    real_sums = packed_class.sums
    monkeypatch.setattr(packed_class, "sums", lambda self, codes: real_sums(self, codes) + 1.0)
    check.cache_clear()  # forget the cached verdict, here and after this test
    request.addfinalizer(check.cache_clear)
    assert check() is False
    from pipeline.kernels.int8 import int_mm_is_exact
    if not int_mm_is_exact():  # oneDNN held below VNNI: the AVX2 kernel where built, else refused, not wrong
        from pipeline.config import ConfigError
        if _avx2_runs():
            assert Int8DynamicLinear(torch.nn.Linear(96, 40), kernel=name).kernel == "avx2"
            return
        with pytest.raises(ConfigError, match="sums exactly"):
            Int8DynamicLinear(torch.nn.Linear(96, 40), kernel=name)
        return
    layer, plain = _pair(name)
    assert layer.kernel != name
    x = _rows(4)
    assert torch.equal(layer(x), plain(x))


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        Int8DynamicLinear(torch.nn.Linear(8, 4), kernel="mkl")


def test_the_exact_case_is_integer_arithmetic_and_a_saturating_int_mm_is_refused(monkeypatch):
    """Without VNNI oneDNN's torch._int_mm saturates its 16-bit pair sums (seen with ONEDNN_MAX_CPU_ISA=AVX2,
    and at AVX512_CORE). The check compares with integer arithmetic, not with _int_mm, and int8-dynamic
    refuses to run on a product that is not exact, naming the stage's choices."""
    from pipeline.config import ConfigError
    from pipeline.kernels import int8
    from pipeline.kernels.exact_check import full_range_case
    qweight, scale, codes, expected = full_range_case()
    exact = sum(int(c) * int(w) for c, w in zip(codes[0].tolist(), qweight[0].tolist()))
    assert exact == 64 * 127 * 127 and torch.equal(expected[0, 0], torch.tensor(float(exact)) * scale[0])
    real = torch._int_mm

    def saturating(a, b):
        """As a kernel without VNNI: the codes shifted to u8 (vpmaddubsw's operand), pair sums clipped
        to int16, the shift taken back out of the int32 total."""
        products = (a.int() + 128)[:, :, None] * b.int()[None, :, :]  # (m, k, n)
        pairs = products.reshape(a.shape[0], a.shape[1] // 2, 2, b.shape[1]).sum(2)
        return pairs.clamp(-32768, 32767).sum(1) - 128 * b.int().sum(0)[None, :]

    monkeypatch.setattr(torch, "_int_mm", saturating)
    int8.int_mm_is_exact.cache_clear()
    try:
        assert int8.int_mm_is_exact() is False
        with pytest.raises(ConfigError, match="int8-dynamic needs an int8 product that sums exactly"):
            Int8DynamicLinear(torch.nn.Linear(64, 8), kernel="int_mm")
    finally:
        monkeypatch.setattr(torch, "_int_mm", real)
        int8.int_mm_is_exact.cache_clear()
    assert int8.int_mm_is_exact() is (torch.equal(real(codes, qweight.t()).float() * scale, expected))
