"""int8-dynamic on oneDNN (CPUs with AMX int8): the packed path gives torch._int_mm's bits, so it may replace it."""
import pytest
import torch

from pipeline.kernels.int8 import Int8DynamicLinear
from pipeline.kernels.onednn_int8 import PackedOnednn, onednn_int8_is_used
from pipeline.precision import model_nbytes


@pytest.fixture
def onednn():
    if not onednn_int8_is_used():
        pytest.skip("no AMX int8 here (or oneDNN is not exact): int8-dynamic uses fbgemm or torch._int_mm")


def _pair(in_features=96, out_features=40, bias=True):
    torch.manual_seed(5)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    return Int8DynamicLinear(linear, kernel="onednn"), Int8DynamicLinear(linear, kernel="int_mm")


def _rows(n, in_features=96):
    return torch.randn(n, in_features) * torch.logspace(-3, 3, n)[:, None]


def test_auto_picks_onednn_on_an_amx_cpu(onednn):
    assert Int8DynamicLinear(torch.nn.Linear(32, 8)).kernel == "onednn"


@pytest.mark.parametrize("fused", [True, False])
def test_onednn_path_equals_int_mm_bit_for_bit_at_every_row_count(onednn, fused):
    packed, plain = _pair()
    packed.fused = fused
    assert (packed.kernel, plain.kernel) == ("onednn", "int_mm")
    with torch.inference_mode():
        for n in (1, 2, 3, 16, 17, 64, 300):
            x = _rows(n)
            assert torch.equal(packed(x), plain(x)), n
        x3 = _rows(12).reshape(3, 4, 96)  # (batch, tokens, features) as the models call it
        assert torch.equal(packed(x3), plain(x3)) and packed(x3).shape == (3, 4, 40)


def test_a_rows_result_does_not_depend_on_its_batch_mates(onednn):
    packed, _ = _pair(bias=False)
    x = _rows(9)
    with torch.inference_mode():
        together = packed(x)
        alone = torch.cat([packed(x[i:i + 1]) for i in range(9)])
        louder = packed(torch.cat([x, 1e6 * torch.ones(1, 96)]))[:9]  # an outlier joins the batch
    assert torch.equal(alone, together) and torch.equal(louder, together)


def test_the_packed_copy_replaces_the_plain_weight(onednn):
    packed, plain = _pair()
    assert packed.qweight is None and "qweight" not in dict(packed.named_buffers())
    assert model_nbytes(packed) == model_nbytes(plain)
    with pytest.raises(RuntimeError, match="oneDNN"):
        packed.int8_weight()


def test_an_inexact_onednn_is_detected_and_another_kernel_used(monkeypatch, request):
    real_sums = PackedOnednn.sums
    monkeypatch.setattr(PackedOnednn, "sums", lambda self, codes: real_sums(self, codes) + 1.0)
    onednn_int8_is_used.cache_clear()  # forget the cached verdict, here and after this test
    request.addfinalizer(onednn_int8_is_used.cache_clear)
    assert onednn_int8_is_used() is False
    layer, plain = _pair()
    assert layer.kernel != "onednn"
    x = _rows(4)
    assert torch.equal(layer(x), plain(x))


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        Int8DynamicLinear(torch.nn.Linear(8, 4), kernel="mkl")
