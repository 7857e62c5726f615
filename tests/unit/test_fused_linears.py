"""pipeline/kernels/fused_linears.py: one packed product for Linears of one input gives each part's columns the
bits of the part's own product at every row count (float32 and bfloat16, Qwen2.5-0.5B's q/k/v and gate/up
shapes), a fused Qwen2 model computes its unfused forward's bits (logits and cache) with no weight held twice,
and a part called on another input than its siblings' computes its own product."""
from __future__ import annotations

import pytest
import torch

from pipeline.kernels.batch_invariance import make_batch_invariant, make_linears_row_invariant
from pipeline.kernels.fused_linears import FusedLinears, FusedPart, fuse_linears
from pipeline.precision import model_nbytes
from tests.unit.test_batch_invariance import BF16_CPU, QWEN_05B

DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=BF16_CPU)]
ROWS = [1, 2, 3, 5, 8, 13, 32, 64, 300, 512]


def row_invariant_linears(sizes, in_features: int, dtype, bias: bool) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    linears = [torch.nn.Linear(in_features, n, bias=bias).to(dtype) for n in sizes]
    make_linears_row_invariant(torch.nn.Sequential(*linears))
    return linears


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes, bias", [((896, 128, 128), True), ((4864, 4864), False)], ids=["qkv", "gate_up"])
def test_a_fused_products_columns_are_each_parts_own_bits_at_every_row_count(dtype, sizes, bias):
    linears = row_invariant_linears(sizes, QWEN_05B["hidden_size"], dtype, bias)
    fused = FusedLinears(linears)
    stream = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, QWEN_05B["hidden_size"], generator=stream).to(dtype)
            parts = fused(x).split(list(sizes), dim=-1)
            assert all(torch.equal(part, linear(x)) for part, linear in zip(parts, linears)), f"{rows} rows"


def qwen2(dtype, fused: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    shape = {**QWEN_05B, "intermediate_size": 1024}  # q/k/v at full width, a narrower MLP (the test's time)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, num_hidden_layers=2, vocab_size=512)).to(dtype).eval()
    make_batch_invariant(model)
    if fused:
        assert fuse_linears(model) == 4  # each layer's attention and MLP
    return model


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_fused_qwen2_gives_its_unfused_forwards_bits_and_holds_each_weight_once(dtype):
    from transformers import DynamicCache
    plain, fused = qwen2(dtype, fused=False), qwen2(dtype, fused=True)
    assert model_nbytes(fused) == model_nbytes(plain)
    attn = fused.model.layers[0].self_attn
    assert type(attn.q_proj) is FusedPart and not list(attn.q_proj.parameters())
    prompt = torch.randint(1, 512, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        caches = [DynamicCache(), DynamicCache()]
        outs = [m(input_ids=prompt, past_key_values=c, use_cache=True).logits for m, c in zip((plain, fused), caches)]
        for _ in range(2):  # decode steps: one row (run as two by the row-invariant product)
            assert torch.equal(*outs)
            token = outs[0][:, -1:].argmax(-1)
            outs = [m(input_ids=token, past_key_values=c, use_cache=True).logits for m, c in zip((plain, fused), caches)]
        assert torch.equal(*outs)
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_part_called_on_another_input_computes_its_own_product():
    linears = row_invariant_linears((16, 8, 8), 32, torch.float32, bias=True)
    fused = FusedLinears(linears)
    q, k, v = (FusedPart(fused, i) for i in range(3))
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    with torch.inference_mode():
        assert torch.equal(q(x), linears[0](x))
        assert torch.equal(k(y), linears[1](y))  # not x's product
        assert torch.equal(k(y), linears[1](y))  # taken twice: afresh
        assert torch.equal(v(x), linears[2](x))
        assert torch.equal(q(x[:1])[0], linears[0](x[:1])[0])  # one row, as the row-invariant Linear runs it
        parts = [part(y) for part in (q, k, v)]
        assert all(torch.equal(got, linear(y)) for got, linear in zip(parts, linears))
    assert fused._output is None and fused._input is None  # nothing kept once every part has taken its columns
