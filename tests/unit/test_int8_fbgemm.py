"""int8-dynamic on fbgemm: the anchored path gives torch._int_mm's bits, so it may replace it."""
import pytest
import torch

from pipeline.kernels.fbgemm import AnchoredFbgemm, fbgemm_is_exact
from pipeline.kernels.int8 import Int8DynamicLinear
from pipeline.precision import model_nbytes


def _pair(in_features=96, out_features=40, bias=True):
    torch.manual_seed(3)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    return Int8DynamicLinear(linear, kernel="fbgemm"), Int8DynamicLinear(linear, kernel="int_mm")


def _rows(n, in_features=96):
    # rows of very different magnitudes: a per-tensor scale would let the loud ones crush the quiet ones
    return torch.randn(n, in_features) * torch.logspace(-3, 3, n)[:, None]


@pytest.fixture
def fbgemm():
    if not fbgemm_is_exact():
        pytest.skip("fbgemm is not exact on this CPU (no VNNI): int8-dynamic uses torch._int_mm, tested elsewhere")


def test_fbgemm_path_equals_int_mm_bit_for_bit_at_every_row_count(fbgemm):
    packed, plain = _pair()
    assert packed._fbgemm is not None and plain._fbgemm is None
    with torch.inference_mode():
        for n in (1, 2, 3, 16, 17, 64):
            x = _rows(n)
            assert torch.equal(packed(x), plain(x)), n
        x3 = _rows(12).reshape(3, 4, 96)  # (batch, tokens, features) as the models call it
        assert torch.equal(packed(x3), plain(x3)) and packed(x3).shape == (3, 4, 40)


def test_a_rows_result_does_not_depend_on_its_batch_mates(fbgemm):
    packed, _ = _pair(bias=False)
    x = _rows(9)
    with torch.inference_mode():
        together = packed(x)
        alone = torch.cat([packed(x[i:i + 1]) for i in range(9)])
        louder = packed(torch.cat([x, 1e6 * torch.ones(1, 96)]))[:9]  # an outlier joins the batch
    assert torch.equal(alone, together) and torch.equal(louder, together)


def test_the_packed_copy_replaces_the_plain_weight(fbgemm):
    packed, plain = _pair()
    assert packed.qweight is None and "qweight" not in dict(packed.named_buffers())
    assert torch.equal(packed.int8_weight(), plain.int8_weight())
    assert model_nbytes(packed) == model_nbytes(plain)  # packed int8 counted once, as the plain int8 was


def test_an_inexact_fbgemm_is_detected_and_int_mm_used(monkeypatch, request):
    real_sums = AnchoredFbgemm.sums
    monkeypatch.setattr(AnchoredFbgemm, "sums", lambda self, codes: real_sums(self, codes) + 1.0)
    fbgemm_is_exact.cache_clear()  # forget the cached verdict, here and after this test
    request.addfinalizer(fbgemm_is_exact.cache_clear)
    assert fbgemm_is_exact() is False
    packed, plain = _pair()
    assert packed._fbgemm is None
    x = _rows(4)
    assert torch.equal(packed(x), plain(x))
