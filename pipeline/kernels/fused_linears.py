"""Linears that read one input as one oneDNN product: a Qwen2 layer's q/k/v and its MLP's gate/up.

oneDNN's packed product gives each output column the same bits whether its weight rows are packed alone
or among others' (measured, torch 2.13, AMD EPYC: float32 and bfloat16, at 2 to 600 rows and at its AVX2,
AVX-512 and avx512_bf16 kernels, Qwen2.5-0.5B's and tiny shapes: tests/unit/test_fused_linears.py), so
the concatenated weight, packed once, replaces the separate ones: one product and one weight read where
there were three (or two). The model's modules keep their places and names: each becomes a
:class:`FusedPart` that returns its columns of the shared product, computed once for the input that its
siblings are called with next (transformers' Qwen2Attention and Qwen2MLP call them in turn on one
tensor); called on another input, a part computes the product afresh.

Only the float Linears oneDNN runs (RowInvariantLinear on the CPU): the int8 and int4 Linears have their
own kernels and stay separate.
"""
from __future__ import annotations

import torch

from pipeline.kernels.batch_invariance import PACKED_FOR_ROWS, RowInvariantLinear

# The Linears fused per module class name: (the fused attribute's name, its parts in column order).
QWEN2_GROUPS = {"Qwen2Attention": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                "Qwen2MLP": ("gate_up_proj", ("gate_proj", "up_proj"))}


def fused_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """RowInvariantLinear's CPU product over 2-d rows: oneDNN's packed matmul, a lone row run as two."""
    n = x.shape[0]
    rows = x.expand(2, -1) if n == 1 else x
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), weight, bias, "none", [None], "")
    return out[:n]


class FusedLinears(torch.nn.Module):
    """Row-invariant Linears of one input as one packed (sum of out features, in) weight; `sizes` the parts'
    out features, in column order."""

    def __init__(self, linears: list[RowInvariantLinear]):
        super().__init__()
        self.in_features = linears[0].in_features
        self.sizes = [linear.out_features for linear in linears]
        ends = [sum(self.sizes[:i + 1]) for i in range(len(self.sizes))]
        self.bounds = list(zip([0] + ends[:-1], ends))  # each part's columns [start, end)
        plain = torch.cat([linear.weight.detach().to_dense() for linear in linears])
        self.weight = torch.nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(plain, PACKED_FOR_ROWS),
                                         requires_grad=False)
        biases = [linear.bias for linear in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("fused Linears need a bias on every part or on none")
        self.bias = None if biases[0] is None else torch.nn.Parameter(torch.cat([b.detach() for b in biases]),
                                                                      requires_grad=False)
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._untaken: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole product: (..., sum of out features)."""
        rows = x.reshape(-1, self.in_features)
        out = fused_product(rows, self.weight, self.bias) if rows.shape[0] else x.new_zeros((0, sum(self.sizes)))
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Part `index`'s columns of the product over `x`: the product is kept until every part has taken its
        columns from it (then dropped), and computed afresh for another input or a part taken twice."""
        if x is not self._input or index not in self._untaken:
            self._input, self._output, self._untaken = x, self.forward(x), set(range(len(self.sizes)))
        out = self._output
        self._untaken.discard(index)
        if not self._untaken:
            self._input = self._output = None
        start, end = self.bounds[index]
        return out[..., start:end]


class FusedPart(torch.nn.Module):
    """One of a FusedLinears' parts in its Linear's place: its columns of the shared product. The FusedLinears
    is held outside the module tree (its owner holds it), so its weight is counted once."""

    def __init__(self, fused: FusedLinears, index: int):
        super().__init__()
        self.index = index
        self.in_features, self.out_features = fused.in_features, fused.sizes[index]
        self.__dict__["fused"] = fused  # not a submodule: the parts share it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)


def fuse_linears(model) -> int:
    """In every Qwen2 attention and MLP under `model` whose parts are all CPU RowInvariantLinears, replace them
    with one FusedLinears (set as the module's `qkv_proj` or `gate_up_proj`) and a FusedPart each in their
    places, dropping the separate weights. Returns how many groups were fused."""
    fused = 0
    for module in model.modules():
        group = QWEN2_GROUPS.get(type(module).__name__)
        if group is None:
            continue
        name, parts = group
        linears = [getattr(module, part) for part in parts]
        if not all(type(linear) is RowInvariantLinear and not linear.weight.is_cuda for linear in linears):
            continue
        whole = FusedLinears(linears)
        setattr(module, name, whole)
        for index, part in enumerate(parts):
            setattr(module, part, FusedPart(whole, index))
        fused += 1
    return fused
