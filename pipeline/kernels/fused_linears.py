"""Linears that read one input as one product: a Qwen2 layer's q/k/v and its MLP's gate/up, on the CPU.

Each output column of the CPU's Linear kernels is its own weight row's product with the input, whatever
rows of weight sit beside it (measured, torch 2.13, AMD EPYC, Qwen2.5-0.5B's and tiny shapes, 1 to 600 rows:
tests/unit/test_fused_linears.py): oneDNN's packed float32 and bfloat16 product at its AVX2, AVX-512 and
avx512_bf16 kernels; and the quantized Linears by construction, their weights quantized per output row
(int8's scale per channel, int4's per channel and group of inputs) and int8-dynamic's activations per input
row: the concatenated weight quantized is each part's quantized. So the parts' float weights are
concatenated into one Linear at load, before the precision variant converts it (it then quantizes or packs
that one), and one product and one weight read replace three (or two). The int4 variant picks a Linear's
kernel and group by its shape: parts are fused only where the fused shape gets each part's own.

The model's modules keep their places and names: each becomes a :class:`FusedPart` returning its columns of
the shared product, computed once for the input its siblings are called with next (transformers'
Qwen2Attention and Qwen2MLP call them in turn on one tensor); called on another input, a part computes the
product afresh. On CUDA nothing is fused: cuBLAS picks its split of a sum by the shape.
"""
from __future__ import annotations

import torch

from pipeline.kernels.int4 import int4_group

# The Linears fused per module class name: (the fused module's attribute name, its parts in column order).
QWEN2_GROUPS = {"Qwen2Attention": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                "Qwen2MLP": ("gate_up_proj", ("gate_proj", "up_proj"))}


class FusedLinears(torch.nn.Module):
    """nn.Linears of one input as one `linear` of their concatenated weights (converted in place afterwards
    like any other Linear); `sizes` the parts' out features, `bounds` their columns [start, end), in order."""

    def __init__(self, linears: list[torch.nn.Linear]):
        super().__init__()
        self.in_features = linears[0].in_features
        self.sizes = [linear.out_features for linear in linears]
        ends = [sum(self.sizes[:i + 1]) for i in range(len(self.sizes))]
        self.bounds = list(zip([0] + ends[:-1], ends))
        biases = [linear.bias for linear in linears]
        whole = torch.nn.Linear(self.in_features, ends[-1], bias=biases[0] is not None, device="meta")
        whole.weight = torch.nn.Parameter(torch.cat([linear.weight.detach() for linear in linears]),
                                          requires_grad=False)
        if biases[0] is not None:
            whole.bias = torch.nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
        self.linear = whole
        # (input, its product, the parts yet to take their columns) or None; replaced whole, never mutated, so a
        # thread reads one consistent snapshot (a race costs a product computed again, never another's columns).
        self._kept: tuple[torch.Tensor, torch.Tensor, frozenset[int]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole product: (..., sum of out features)."""
        return self.linear(x)

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Part `index`'s columns of the product over `x`: the product is kept until every part has taken its
        columns from it (then dropped), and computed afresh for another input or a part taken twice."""
        kept = self._kept
        if kept is None or kept[0] is not x or index not in kept[2]:
            kept = (x, self.forward(x), frozenset(range(len(self.sizes))))
        untaken = kept[2] - {index}
        self._kept = (kept[0], kept[1], untaken) if untaken else None
        start, end = self.bounds[index]
        return kept[1][..., start:end]


class FusedPart(torch.nn.Module):
    """One of a FusedLinears' parts in its Linear's place: its columns of the shared product. The FusedLinears
    is held outside the module tree (its owner holds it), so its weight is counted and converted once."""

    fused: FusedLinears

    def __init__(self, fused: FusedLinears, index: int):
        super().__init__()
        self.index = index
        self.in_features, self.out_features = fused.in_features, fused.sizes[index]
        self.__dict__["fused"] = fused  # not a submodule: the parts share it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)


def _fusable(linears) -> bool:
    """Plain CPU nn.Linears of one dtype, all with a bias or none, each getting the int4 variant's kernel and
    group as their fused shape would."""
    first = linears[0]
    if any(type(linear) is not torch.nn.Linear or linear.weight.device.type != "cpu"
           or linear.weight.dtype != first.weight.dtype or (linear.bias is None) != (first.bias is None)
           for linear in linears):
        return False
    group = int4_group(first.in_features, sum(linear.out_features for linear in linears))
    return all(int4_group(linear.in_features, linear.out_features) == group for linear in linears)


def fuse_linears(model) -> int:
    """In every Qwen2 attention and MLP under `model` whose parts are plain CPU nn.Linears (before any
    conversion), put one FusedLinears (as the module's `qkv_proj` or `gate_up_proj`) and a FusedPart in each
    part's place, the separate weights dropped. Returns how many groups were fused."""
    fused = 0
    for module in list(model.modules()):
        group = QWEN2_GROUPS.get(type(module).__name__)
        if group is None:
            continue
        name, parts = group
        linears = [getattr(module, part) for part in parts]
        if not _fusable(linears):
            continue
        whole = FusedLinears(linears)
        setattr(module, name, whole)
        for index, part in enumerate(parts):
            setattr(module, part, FusedPart(whole, index))
        fused += 1
    return fused
