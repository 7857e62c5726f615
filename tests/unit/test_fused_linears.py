"""pipeline/kernels/fused_linears.py: one product for Linears of one input gives each part's columns the bits of
the part's own product at every row count in every CPU precision (Qwen2.5-0.5B's q/k/v and gate/up shapes), a
fused Qwen2 model computes its unfused forward's bits (logits and cache) with no weight held twice, and a part
called on another input than its siblings' computes its own product."""
from __future__ import annotations

import pytest
import torch

from pipeline import precision
from pipeline.kernels.batch_invariance import PackedBf16Linear, make_linears_row_invariant
from pipeline.kernels.fused_linears import FusedLinears, FusedPart
from pipeline.kernels.int8 import convert_linears
from pipeline.precision import QUANTIZED, apply_precision, model_nbytes
from pipeline.precision_policy import LOAD_DTYPE
from tests.unit.test_batch_invariance import QWEN_05B
from tests.unit.test_qwen2_step import CPU_VARIANTS

ROWS = [1, 2, 3, 5, 8, 13, 32, 64, 300, 512]


def converted(module, variant: str):
    """`module`'s nn.Linears as apply_precision converts them in `variant` (then the float ones row-invariant)."""
    with torch.no_grad():
        if variant in QUANTIZED:
            convert_linears(module, QUANTIZED[variant])
        make_linears_row_invariant(module)
    return module


@pytest.mark.parametrize("variant", CPU_VARIANTS)
@pytest.mark.parametrize("sizes, bias", [((896, 128, 128), True), ((4864, 4864), False)], ids=["qkv", "gate_up"])
def test_a_fused_products_columns_are_each_parts_own_bits_at_every_row_count(variant, sizes, bias):
    dtype = getattr(torch, LOAD_DTYPE[variant])
    torch.manual_seed(0)
    linears = [torch.nn.Linear(QWEN_05B["hidden_size"], n, bias=bias).to(dtype) for n in sizes]
    fused = converted(torch.nn.Sequential(FusedLinears(linears)), variant)[0]
    parts = converted(torch.nn.Sequential(*linears), variant)
    stream = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, QWEN_05B["hidden_size"], generator=stream).to(dtype)
            got = fused(x).split(list(sizes), dim=-1)
            assert all(torch.equal(a, part(x)) for a, part in zip(got, parts)), f"{rows} rows"


def qwen2(variant: str, fused: bool, monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    shape = {**QWEN_05B, "intermediate_size": 1024}  # q/k/v at full width, a narrower MLP (the test's time)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, num_hidden_layers=2, vocab_size=512))
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(precision, "fuse_linears", lambda model: 0)
        return apply_precision(model.to(getattr(torch, LOAD_DTYPE[variant])).eval(), variant)


def held_bytes(model) -> int:
    """model_nbytes without the bfloat16 kernel's padding of its packed weights (whole groups of channels): a fused
    Linear pads once where its parts padded each."""
    padding = sum((m.weight.numel() - m.out_features * m.in_features) * m.weight.element_size()
                  for m in model.modules() if isinstance(m, PackedBf16Linear))
    return model_nbytes(model) - padding


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_a_fused_qwen2_gives_its_unfused_forwards_bits_and_holds_each_weight_once(variant, monkeypatch):
    from transformers import DynamicCache
    plain, fused = qwen2(variant, False, monkeypatch), qwen2(variant, True, monkeypatch)
    assert held_bytes(fused) == held_bytes(plain)
    for layer in fused.model.layers:
        assert {type(m) for m in (layer.self_attn.q_proj, layer.mlp.up_proj)} == {FusedPart}
        assert not list(layer.self_attn.q_proj.parameters()) and not list(layer.mlp.up_proj.buffers())
    prompt = torch.randint(1, 512, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        caches = [DynamicCache(), DynamicCache()]
        outs = [m(input_ids=prompt, past_key_values=c, use_cache=True).logits for m, c in zip((plain, fused), caches)]
        for _ in range(2):  # decode steps: one row
            assert torch.equal(*outs)
            token = outs[0][:, -1:].argmax(-1)
            outs = [m(input_ids=token, past_key_values=c, use_cache=True).logits for m, c in zip((plain, fused), caches)]
        assert torch.equal(*outs)
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_part_called_on_another_input_computes_its_own_product():
    torch.manual_seed(0)
    linears = [torch.nn.Linear(32, n) for n in (16, 8, 8)]
    fused = converted(torch.nn.Sequential(FusedLinears(linears)), "float32")[0]
    converted(torch.nn.Sequential(*linears), "float32")
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
    assert fused._kept is None  # nothing kept once every part has taken its columns


def test_parts_called_from_two_threads_on_their_own_inputs_each_get_their_own_products_columns():
    """Two threads taking the parts of one FusedLinears in turn on their own inputs, interleaved: each part
    returns its columns of its own input's product (a shared kept product must never leak across)."""
    import sys
    import threading
    torch.manual_seed(0)
    linears = [torch.nn.Linear(32, n) for n in (16, 8, 8)]
    fused = FusedLinears(linears)
    parts = [FusedPart(fused, i) for i in range(3)]
    inputs = [torch.randn(3, 32) for _ in range(2)]
    with torch.inference_mode():
        expected = [[linear(x) for linear in linears] for x in inputs]
    wrong: list[tuple[int, int, int]] = []
    start = threading.Barrier(2)

    def run(who: int) -> None:
        start.wait()
        with torch.inference_mode():
            for round_ in range(2000):
                for index, part in enumerate(parts):
                    if not torch.equal(part(inputs[who]), expected[who][index]):
                        wrong.append((who, round_, index))

    threads = [threading.Thread(target=run, args=(who,)) for who in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the interpreter switches threads between almost any two bytecodes
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    assert wrong == []
