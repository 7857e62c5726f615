"""A row's result independent of its batch-mates: Linears, norms and SDPA attention over padded batches.

* :class:`PackedBf16Linear` (via :func:`make_linears_row_invariant`): a bfloat16 Linear on a CPU with
  AVX-512 BF16 through pipeline.kernels.avx512_bf16, each row summed in one fixed order by construction.
* :class:`RowInvariantLinear` (via :func:`make_linears_row_invariant`): any other float32 or bfloat16
  Linear on the CPU through oneDNN, a lone row run as a batch of two, the way every batch runs.
* :class:`RowInvariantRMSNorm` (via :func:`make_norms_row_invariant`): a decoder's RMSNorm whose
  mean of squares is :func:`per_row`'s: on CUDA in launches of one shape.
* :func:`use_batch_invariant_attention`: a transformers model (decoder or encoder) attends each
  padded row over its own keys, as it would alone.
* :func:`make_batch_invariant`: all three, for every transformers model inside a module.

Measured (torch 2.13, AMD EPYC avx512_bf16): MKL's float32 GEMM (what ``F.linear`` runs) sums a row
differently at 1, 2-4 and 5+ rows; the bfloat16 ``F.linear`` leaves small GEMMs to a native kernel
and larger ones to oneDNN; oneDNN's matmul called directly (``torch.ops.mkldnn._linear_pointwise``)
gives every row the same bits at any row count from 2 up (checked to 4,100 rows, bert-base,
Qwen-0.5B and toy shapes), and at 1 row often not. That holds for oneDNN's AVX2 and AVX-512 kernels
(tests/unit/test_kernels_per_isa.py runs the invariance tests at each level the machine has), not
for its AMX kernels, which it picks by the row count (on an Intel Xeon with AMX, bfloat16 rows among
64 got other bits than alone): on a CPU with AMX oneDNN is held below AMX for the whole process
(pipeline.cpu_features, set when the pipeline package is imported; a hold at AMX is refused at load).
A bfloat16 Linear on a CPU with AVX-512 BF16 (every CPU with AMX has it) does not rest on that
measurement: it runs pipeline.kernels.avx512_bf16, whose sums are per row in one order by construction;
oneDNN takes the float32 Linears, and the bfloat16 ones where that kernel is not built.

Reductions along a row (a norm's mean, a vector's length): torch's CPU kernels reduce each row in
one thread in one order, splitting the work across threads only by rows (one row of 32,768
elements or more would be split: no row here is that long), so the CPU takes them as they are
(tests/unit/test_batch_invariance.py, at 1, 2 and 8 threads). CUDA's reduction chooses its threads
per row from the number of rows (PyTorch's ReduceConfig: fewer rows, more threads on each), so
there a row's sum is grouped by its batch-mates' count unless every launch has one shape: tiles of
CUDA_TILE_ROWS rows. LayerNorm needs no tiles: its CUDA kernel gives each row one block of a fixed
size. Read from PyTorch's sources, not measured on a GPU.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from pipeline.kernels import avx512_bf16, cuda_attention
from pipeline.kernels.chunked_attention import chunked_attention_forward, ordered_attention_runs
from pipeline.kernels.versions import check_kernel_versions

# The name under which the attention is registered with transformers.
BATCH_INVARIANT_ATTENTION = "batch_invariant_sdpa"
# The Linears made row-invariant per device: the dtypes each offers (pipeline/precision_policy.py).
ROW_INVARIANT_DTYPES = {"cpu": (torch.float32, torch.bfloat16), "cuda": (torch.bfloat16, torch.float16)}


# The row count oneDNN's packed layout is chosen for (any count gives the same bits): a decode step's.
PACKED_FOR_ROWS = 8
# Rows per cuBLAS call or per-row reduction on CUDA: every launch of a model has one shape, so one
# kernel sums every row in one order. A decoder's decode step has a few rows (up to its largest
# bucket); an encoder's rows are its batch's tokens, hundreds to thousands, where tiles of 64 made
# one rerank (ten pairs) about 3,200 launches on an H200: 110 ms, against 47 ms in tiles of 1,024
# (docs/performance.md, section 14).
CUDA_TILE_ROWS = 64
ENCODER_CUDA_TILE_ROWS = 1024


def per_row(x: torch.Tensor, reduce) -> torch.Tensor:
    """`reduce` (a reduction over the last dimension, keepdim) of every row of `x`, each row's result
    independent of the rows beside it: at once on the CPU; on CUDA in launches of exactly
    CUDA_TILE_ROWS rows, the last one zero-padded."""
    if not x.is_cuda or x.numel() == 0:
        return reduce(x)
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    tiles = [reduce(tile) for tile in torch.nn.functional.pad(rows, (0, 0, 0, -n % CUDA_TILE_ROWS)).split(CUDA_TILE_ROWS)]
    out = tiles[0] if len(tiles) == 1 else torch.cat(tiles)
    return out[:n].reshape(*x.shape[:-1], out.shape[-1])


def _mean_of_squares(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(-1, keepdim=True)


class RowInvariantRMSNorm(torch.nn.Module):
    """transformers' Llama-style RMSNorm (Qwen2RMSNorm: float32 inside, eps in `variance_epsilon`),
    the same operations in the same order, its mean of squares taken by :func:`per_row`: the same
    bits on the CPU, one launch shape on CUDA."""

    weight: torch.nn.Parameter
    variance_epsilon: float

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = per_row(hidden_states, _mean_of_squares)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _llama_style_norms() -> tuple[type, ...]:
    """The RMSNorm classes whose forward RowInvariantRMSNorm repeats (checked by
    tests/unit/test_batch_invariance.py against the class's own)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    return (Qwen2RMSNorm,)


def make_norms_row_invariant(model) -> int:
    """Swap the class of every Llama-style RMSNorm under `model` for RowInvariantRMSNorm; returns how many."""
    norms = [m for m in model.modules() if type(m) in _llama_style_norms()]
    for norm in norms:
        norm.__class__ = RowInvariantRMSNorm
    return len(norms)


class RowInvariantLinear(torch.nn.Linear):
    """A float Linear whose result for a row does not depend on how many rows come with it.

    CPU: oneDNN's matmul for every row count, a lone row run as two (oneDNN takes another kernel
    for one row), its weight packed once in oneDNN's layout (the same bits as the plain weight at
    every row count; a decode step 10-30 % faster, docs/performance.md). CUDA: cuBLAS picks its
    kernel (and its split of the sum) by the row count, so the rows go in tiles of
    `cuda_tile_rows` (fixed per model: :func:`make_batch_invariant`), the last one zero-padded."""

    cuda_tile_rows = CUDA_TILE_ROWS

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n == 0:
            return x.new_zeros((*x.shape[:-1], self.out_features))
        if self.weight.is_cuda:
            tile = self.cuda_tile_rows
            tiles = torch.nn.functional.pad(rows, (0, 0, 0, -n % tile)).split(tile)
            products = [torch.nn.functional.linear(tile, self.weight, self.bias) for tile in tiles]
            out = products[0] if len(products) == 1 else torch.cat(products)
            return out[:n].reshape(*x.shape[:-1], self.out_features)
        rows = rows.expand(2, -1) if n == 1 else rows
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.weight, self.bias, "none", [None], "")
        return out[:n].reshape(*x.shape[:-1], self.out_features)


class PackedBf16Linear(torch.nn.Linear):
    """A bfloat16 Linear on a CPU with AVX-512 BF16: pipeline.kernels.avx512_bf16's product, every row summed in
    one fixed order whatever its batch-mates (one row included), over its weight packed once for it (the
    ``weight`` parameter holds the packed copy). At a decode step's rows it reads its weight at 1.4-1.8x
    oneDNN's pace; at encoder and prefill sizes it is level with oneDNN (docs/performance.md, section 25)."""

    product: Any  # the kernel's op, given at conversion (make_linears_row_invariant)

    def forward(self, x):
        parameters = self._parameters  # read directly: nn.Module's attribute lookup costs ~1 µs a time
        out = self.product(x.reshape(-1, self.in_features), parameters["weight"], self.out_features,
                           parameters["bias"])
        return out.reshape(*x.shape[:-1], self.out_features)


def make_linears_row_invariant(model) -> int:
    """Swap the class of every nn.Linear in a dtype of ROW_INVARIANT_DTYPES[its device]. On the CPU a
    bfloat16 one becomes a PackedBf16Linear where pipeline.kernels.avx512_bf16 is built for this CPU, any
    other a RowInvariantLinear; its weight is replaced by the kernel's packed copy. An output layer tied
    to the input embedding gets its own packed copy (the lookups keep the plain one): the model's output
    embeddings must be untied first (pipeline.kernels.int8.untie_output_embeddings). Returns how many
    Linears were swapped."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear
               and m.weight.dtype in ROW_INVARIANT_DTYPES.get(m.weight.device.type, ())]
    bf16_product = avx512_bf16.EXTENSION.registered("bf16_linear")  # None where not built for this CPU
    for linear in linears:
        weight = linear.weight.detach()
        if weight.is_cuda:
            linear.__class__ = RowInvariantLinear
            continue
        if weight.dtype == torch.bfloat16 and bf16_product is not None:
            linear.__class__ = PackedBf16Linear
            linear.product = bf16_product
            packed = avx512_bf16.pack(weight)
        else:
            linear.__class__ = RowInvariantLinear
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
        linear.weight = torch.nn.Parameter(packed, requires_grad=False)
    return len(linears)


# The last mask's runs on each thread: transformers hands every layer of a forward the same mask, and reading
# the runs back is three device syncs on a GPU (each draining the queue the host had run ahead with).
_LAST_RUNS = threading.local()


def _row_key_runs(attention_mask) -> list[tuple[int, int]] | None:
    """:func:`_key_runs` of `attention_mask`, computed once per mask (the same tensor, unchanged since) on a thread.
    An inference-mode tensor keeps no version count: there the same tensor is enough (transformers builds each
    forward's mask anew and never changes it)."""
    version = None if attention_mask.is_inference() else attention_mask._version
    last = getattr(_LAST_RUNS, "mask", None)
    if last is not None and last[0]() is attention_mask and last[1] == version:
        return last[2]
    runs = _key_runs(attention_mask)
    _LAST_RUNS.mask = (weakref.ref(attention_mask), version, runs)
    return runs


def _key_runs(attention_mask) -> list[tuple[int, int]] | None:
    """Each row's visible keys as one run [start, end), or None where some row's are not one
    unbroken run (padding in the middle: neither left- nor right-padded)."""
    visible = attention_mask[:, 0].any(dim=1)  # (rows, keys): seen by any of the row's queries
    keys = visible.shape[1]
    starts = visible.int().argmax(dim=1)
    ends = keys - visible.flip(1).int().argmax(dim=1)
    column = torch.arange(keys, device=visible.device)[None, :]
    run = (column >= starts[:, None]) & (column < ends[:, None])
    return list(zip(starts.tolist(), ends.tolist())) if torch.equal(visible, run) else None


def _ordered_or_decode(module, query, key, attention_mask) -> bool:
    """Whether a decoder's call goes to pipeline.kernels.chunked_attention whole: a decode step (one query a row),
    or, on a CPU where pipeline.kernels.ordered_attention is built, any prompt's queries (a whole prompt, or a
    later chunk after the keys before it; a bool mask, or none with as many queries as keys). A mask-less call
    with more keys than queries is transformers' upper-left case (a static cache's first prefill), left to SDPA."""
    if not getattr(module, "is_causal", False) or not (attention_mask is None or attention_mask.dtype == torch.bool):
        return False
    queries = query.shape[2]
    return queries == 1 or (ordered_attention_runs(query) and (attention_mask is not None or queries == key.shape[2]))


def _batch_invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, run for each row of a padded batch over its own keys.

    SDPA's CPU kernel sums keys in blocks counted from the first column and sizes its blocks by
    the sequence length, so padding (left, a decoder's; right, an encoder's) changes how a row's
    attention rounds. Each padded row is sliced to its real keys and queries and given exactly
    what it would be given alone: transformers passes no mask for an unpadded encoder row, nor
    for a decoder row whose queries are 1 or all of its keys (SDPA then runs is_causal). A batch
    without padding is one call on the CPU (its kernels compute each row and head on its own).
    On CUDA an encoder's batch is one masked call and a decoder's prompts go row by row, each with a
    mask (pipeline.kernels.cuda_attention): never FlashAttention, which splits a row's keys into as
    many pieces as rows x heads leave its multiprocessors room for (PyTorch's num_splits_heuristic).
    Queries outside a row's run are padding: nothing reads them.

    A decoder's decode step (one query per row) is one call for the whole batch instead:
    pipeline.kernels.chunked_attention, which on a CPU where it is built runs
    pipeline.kernels.ordered_attention (each query's keys in order) and elsewhere fixed chunks counted
    from each row's first key, as a row alone has them. On a CPU where that kernel is built a decoder's
    prompts take it too, the batch in one call (:func:`_ordered_or_decode`): SDPA's blocks follow the
    call's length, so a prompt cut into chunks (the engine's) would round otherwise than whole (the
    reference's)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if _ordered_or_decode(module, query, key, attention_mask):
        return chunked_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q_len, kv_len = query.shape[2], key.shape[2]
    runs = None if attention_mask is None or attention_mask.dtype != torch.bool else _row_key_runs(attention_mask)
    if attention_mask is None and query.is_cuda:
        runs = [(0, kv_len)] * query.shape[0]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    if query.is_cuda and not causal and runs is not None and q_len == kv_len:
        return cuda_attention.bidirectional(query, key, value, runs, attention_mask, kwargs.get("scaling")), None
    unpadded = runs is not None and all(run == (0, kv_len) for run in runs)
    # on CUDA every prompt's queries (a whole prompt's, or a later chunk's after keys before them) go by the row
    # loop, each row through one kernel (cuda_attention.causal); a mask-less call with more keys than queries is
    # transformers' upper-left case (a static cache's first prefill), left to it
    prefill_on_cuda = query.is_cuda and causal and q_len > 1 and (attention_mask is not None or q_len == kv_len)
    if runs is None or (unpadded and not prefill_on_cuda and (query.shape[0] == 1 or not query.is_cuda)):
        return sdpa_attention_forward(module, query, key, value, attention_mask=attention_mask, **kwargs)
    past = kv_len - q_len  # query i is key past + i
    output = query.new_zeros((query.shape[0], q_len, query.shape[1], value.shape[3]))
    for row, (start, end) in enumerate(runs):
        q0, q1 = max(0, start - past), min(q_len, end - past)
        if prefill_on_cuda and q1 - q0 > 1:
            output[row, q0:q1] = cuda_attention.causal(query[row:row + 1, :, q0:q1], key[row:row + 1, :, start:end],
                                                       value[row:row + 1, :, start:end], kwargs.get("scaling"))[0]
            continue
        mask = None if attention_mask is None else attention_mask[row:row + 1, :, q0:q1, start:end]
        if not causal or q1 - q0 == 1 or q1 - q0 == end - start:
            # as transformers does for an unpadded row: no mask (bidirectional, or is_causal over a whole prompt)
            mask = None
        out, _ = sdpa_attention_forward(module, query[row:row + 1, :, q0:q1], key[row:row + 1, :, start:end],
                                        value[row:row + 1, :, start:end], attention_mask=mask, **kwargs)
        output[row, q0:q1] = out[0]
    return output, None


def attend_without_cudnn() -> None:
    """SDPA on CUDA picks among FlashAttention, memory-efficient attention and cuDNN's; on Hopper torch tries
    cuDNN's first, and cuDNN builds an execution plan for every new shape it meets (tens to hundreds of ms
    each). :func:`_batch_invariant_sdpa` runs each row at its own length, so almost every request brings new
    shapes: on an H200 an idle rerank took 433-467 ms in the cluster and 61-63 ms once its lengths had been
    seen (docs/performance.md, section 30). FlashAttention and memory-efficient attention have no per-shape
    plans. Process-wide: torch's switch is global, and a process serves its models on one device."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def use_batch_invariant_attention(model) -> None:
    """Make `model` (a transformers model) attend with :func:`_batch_invariant_sdpa`; on CUDA, SDPA in this
    process no longer takes cuDNN's kernel (:func:`attend_without_cudnn`).

    Raises ConfigError where torch or transformers is outside the versions this was verified against."""
    check_kernel_versions(model.device.type)
    if model.device.type == "cuda":
        attend_without_cudnn()
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(BATCH_INVARIANT_ATTENTION, _batch_invariant_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(BATCH_INVARIANT_ATTENTION, sdpa_mask)  # the masks SDPA gets
    model.set_attn_implementation(BATCH_INVARIANT_ATTENTION)


def make_batch_invariant(module) -> None:
    """Every transformers model inside `module` (itself, or a sentence-transformers model's) attends
    with :func:`_batch_invariant_sdpa`, and every float Linear and Llama-style RMSNorm under it is
    row-invariant.

    On CUDA an encoder's Linears (a model that cannot generate) run in tiles of ENCODER_CUDA_TILE_ROWS,
    a decoder's in tiles of CUDA_TILE_ROWS.

    Raises ConfigError where torch or transformers is outside the versions this was verified against."""
    from transformers import PreTrainedModel
    inner: set[int] = set()
    encoders = []
    for model in module.modules():
        if isinstance(model, PreTrainedModel) and id(model) not in inner:
            use_batch_invariant_attention(model)
            inner.update(id(m) for m in model.modules())
            if not model.can_generate():
                encoders.append(model)
    make_linears_row_invariant(module)
    for encoder in encoders:
        for linear in encoder.modules():
            if isinstance(linear, RowInvariantLinear):
                linear.cuda_tile_rows = ENCODER_CUDA_TILE_ROWS
    make_norms_row_invariant(module)
