"""pipeline/continuous/qwen2_step.py: the CPU decode step gives the model's own forward's bits (logits and the
keys and values it writes) in every CPU precision, at one row (run as a pair) and at several with rows of
other lengths and an idle prefilling row among them, across a chunk boundary, at Qwen2.5-0.5B's layer
layout (tiny widths) and at its real width (one layer); the runner takes it only where it computes that."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from pipeline.continuous.qwen2_step import Qwen2DecodeStep, qwen2_decode_step
from pipeline.continuous.runner import ModelRunner
from pipeline.continuous.scheduler import SequenceState
from pipeline.continuous.slots import SlotRule, chunks_for
from pipeline.kernels import avx512_bf16, vnni_int8
from pipeline.kernels.batch_invariance import PackedBf16Linear
from pipeline.kernels.chunked_attention import CHUNK, chunk_masks, decode_attention, flash_chunked_attention
from pipeline.kernels.decode_glue import EXTENSION as GLUE
from pipeline.kernels.decode_layers import EXTENSION as LAYERS
from pipeline.kernels.int4 import Int4DynamicLinear, Int4WeightLinear
from pipeline.kernels.int8 import Int8DynamicLinear
from pipeline.kernels.ordered_attention import EXTENSION as ORDERED
from pipeline.precision import apply_precision
from pipeline.precision_policy import LOAD_DTYPE
from tests.unit.test_batch_invariance import BF16_CPU, QWEN_05B

VOCAB = 512
QUANTIZED_LINEARS = (Int8DynamicLinear, Int4DynamicLinear, Int4WeightLinear)
TINY: dict[str, Any] = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "tie_word_embeddings": True}
CPU_VARIANTS = [pytest.param("float32"), pytest.param("bfloat16", marks=BF16_CPU), pytest.param("int8-dynamic"),
                pytest.param("int8-weight", marks=BF16_CPU), pytest.param("int4-dynamic"),
                pytest.param("int4-weight", marks=BF16_CPU)]


def qwen2(variant: str, shape: dict[str, Any], layers: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(**shape, num_hidden_layers=layers, vocab_size=VOCAB, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).to(getattr(torch, LOAD_DTYPE[variant])).eval()
    return apply_precision(model, variant)


def steps_agree(model, lengths: list[int], slots: int, steps: int = 3, one_call: bool | None = None) -> None:
    """Prefill `lengths` into slots of a runner (with more than two, the second's prompt only half: it rides
    idle between decoding rows, fed token 0 as the runner feeds it), then per step: the fast step's logits
    and written keys and values equal the model forward's on the same table. `one_call`: whether the step
    must run its layers in one call (pipeline.kernels.decode_layers), where given."""
    runner = ModelRunner(model, SlotRule(slots, slots * 3 * CHUNK, CHUNK))
    assert isinstance(runner.fast_step, Qwen2DecodeStep)
    assert one_call is None or runner.fast_step.layers_in_one_call is one_call
    table, stream = runner.table, torch.Generator().manual_seed(1)
    with torch.inference_mode():
        seqs = [SequenceState(i, torch.randint(1, VOCAB, (n,), generator=stream).tolist(), 8)
                for i, n in enumerate(lengths)]
        for seq in seqs:
            table.join(seq.seq_id, seq.prompt_ids, seq.budget_tokens, seq.sampling)
            first = runner.prefill_chunk(seq, 0, seq.prompt_len)
            assert first is not None
            seq.generated.append(first)
        idle = 1 if len(lengths) > 2 else None
        if idle is not None:
            table.rows[idle].length = lengths[idle] // 2
        for _ in range(steps):
            rows = len(seqs)
            columns = torch.tensor([row.length for row in table.rows[:rows]])
            ids = torch.tensor([[0 if i == idle else seq.generated[-1]] for i, seq in enumerate(seqs)])
            width = chunks_for(int(columns.max()) + 1)
            fast = runner.fast_step(ids, columns, width).clone()
            written = [t.clone() for t in (*table.keys.values(), *table.values.values())]
            slow = runner.model_forward(ids, columns, width)
            assert fast.shape == slow.shape == (rows, VOCAB)
            assert torch.equal(fast, slow), f"rows {lengths} at columns {columns.tolist()}"
            assert all(torch.equal(a, b) for a, b in zip(written, (*table.keys.values(), *table.values.values())))
            for i, (seq, row, token) in enumerate(zip(seqs, table.rows, fast.argmax(-1).tolist())):
                if i != idle:
                    seq.generated.append(token)
                    row.length += 1


ORDERED_BUILT = pytest.mark.skipif(ORDERED.ops() is None, reason="the ordered attention is not built for this CPU")
# Which attention kernel the CPU runs: the ordered one where built, else the flash chunks (ORDERED.ops None).
ATTENTION = [pytest.param("ordered", marks=ORDERED_BUILT), "chunked"]


GLUE_BUILT = pytest.mark.skipif(GLUE.ops() is None, reason="the decode glue is not built for this CPU")
LAYERS_BUILT = pytest.mark.skipif(LAYERS.ops() is None, reason="the one-call decode layers are not built")
BF16_KERNEL = pytest.mark.skipif(avx512_bf16.EXTENSION.ops() is None,
                                 reason="pipeline.kernels.avx512_bf16 is not built for this CPU")
# The step's kernels: as built here (ordered attention, the glue in C++, the layers in one call), the layers
# looped in Python, the glue as torch ops, neither.
KERNELS = [pytest.param("ordered", "glue", "one call", marks=[ORDERED_BUILT, GLUE_BUILT, LAYERS_BUILT]),
           pytest.param("ordered", "glue", "python", marks=[ORDERED_BUILT, GLUE_BUILT]),
           pytest.param("ordered", "torch", "python", marks=ORDERED_BUILT), ("chunked", "torch", "python")]


def attention_kernel(kind: str, monkeypatch) -> None:
    if kind == "chunked":
        monkeypatch.setattr(ORDERED, "ops", lambda: None)


def glue_kernel(kind: str, monkeypatch) -> None:
    if kind == "torch":
        monkeypatch.setattr(GLUE, "ops", lambda: None)


def layers_loop(kind: str, monkeypatch) -> None:
    if kind == "python":
        monkeypatch.setattr(LAYERS, "ops", lambda: None)


def one_call_expected(variant: str, loop: str) -> bool:
    """Whether the step runs its layers in one call: where built, over products it calls (oneDNN's
    row-invariant one, the VNNI int8 and int4 kernels); int8-weight and int4-weight loop in Python."""
    vnni = vnni_int8.EXTENSION.ops() is not None
    return loop == "one call" and (variant in ("float32", "bfloat16") or
                                   (variant in ("int8-dynamic", "int4-dynamic") and vnni))


@pytest.mark.parametrize("attention, glue, loop", KERNELS)
@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_the_fast_step_gives_the_model_forwards_bits_in_every_cpu_precision(variant, attention, glue, loop,
                                                                             monkeypatch):
    attention_kernel(attention, monkeypatch)
    glue_kernel(glue, monkeypatch)
    layers_loop(loop, monkeypatch)
    model = qwen2(variant, TINY, layers=6)
    steps_agree(model, [7], slots=4, one_call=one_call_expected(variant, loop))  # one row: run as a pair
    steps_agree(model, [CHUNK - 2], slots=1)  # one row, one slot; its keys cross into a second chunk
    steps_agree(model, [2 * CHUNK + 40, 3, CHUNK - 1, 90], slots=4)  # chunks some rows do not see, an idle row


def profiled_ops(step, ids, columns, width: int) -> list[tuple[str, list]]:
    """Each op one step dispatches, as the profiler records it (ops called from C++ too): its name without the
    namespace, its inputs' shapes."""
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as recorded:
        step(ids, columns, width)
    return [(event.name.split("::")[-1], event.input_shapes) for event in recorded.events()]


@pytest.mark.parametrize("loop", [pytest.param("one call", marks=LAYERS_BUILT), "python"])
@pytest.mark.parametrize("variant", ["int8-dynamic", "int4-dynamic", pytest.param("int4-weight", marks=BF16_CPU),
                                     pytest.param("bfloat16", marks=[BF16_CPU, BF16_KERNEL])])
def test_a_lone_row_goes_once_through_linears_that_give_a_row_its_bits_alone(variant, loop, monkeypatch):
    """A RowInvariantLinear widens one row to two, so a lone row runs as a pair; a quantized Linear, or a
    bfloat16 one through pipeline.kernels.avx512_bf16, gives a row the same bits alone, so the step multiplies
    the row once (steps_agree: the same logits as the forward)."""
    from profiling.lib.engine_step import PRODUCT_OPS
    layers_loop(loop, monkeypatch)
    model = qwen2(variant, TINY, layers=2)
    alone = [m for m in model.modules() if isinstance(m, (*QUANTIZED_LINEARS, PackedBf16Linear))]
    assert len(alone) >= 2 * 4 + 1  # q/k/v, o, gate/up and down a layer (fused), the output layer
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m not in alone]
    runner = prefilled_runner(model, [7])
    assert runner.fast_step.layers_in_one_call is one_call_expected(variant, loop)
    ops = profiled_ops(runner.fast_step, torch.ones(1, 1, dtype=torch.long), torch.tensor([7]), CHUNK)
    assert [shapes[0][0] for name, shapes in ops if name in PRODUCT_OPS] == [1] * len(alone)  # each once, 1 row
    steps_agree(model, [7], slots=2, steps=1, one_call=one_call_expected(variant, loop))


@LAYERS_BUILT
@pytest.mark.parametrize("variant", ["float32", pytest.param("bfloat16", marks=BF16_CPU), "int8-dynamic",
                                     "int4-dynamic"])
def test_the_one_call_layers_dispatch_the_python_loops_ops_and_a_dispatch_mode_sees_them_all(variant, monkeypatch):
    """The one call's ops, as the profiler sees them, are the Python loop's (names and input shapes, in order);
    while a dispatch mode is on (profiling's op counter), the step loops in Python, so the mode sees them too."""
    from profiling.lib.engine_step import OpCounter
    model = qwen2(variant, TINY, layers=3)
    lengths = [CHUNK + 5, 20]
    step = [prefilled_runner(model, lengths).fast_step for _ in range(2)]  # the same state in each
    args = torch.ones(2, 1, dtype=torch.long), torch.tensor(lengths), 2 * CHUNK
    custom = {"rms_norm", "add_rms_norm", "rotate_and_store", "silu_mul", "ordered_attention", "_linear_pointwise",
              "vnni_linear", "avx2_linear", "vnni_int4_linear", "avx2_int4_linear", "bf16_linear"}
    assert step[0].layers_in_one_call
    one_call = [op for op in profiled_ops(step[0], *args) if op[0] in custom]
    counter = OpCounter()
    with torch.inference_mode(), counter.mode:
        step[1](*args)
    monkeypatch.setattr(LAYERS, "ops", lambda: None)
    assert not step[1].layers_in_one_call
    looped = [op for op in profiled_ops(step[1], *args) if op[0] in custom]
    assert one_call == looped and len(looped) >= 3 * 8
    assert sum(counter.counts[name] for name in custom) == len(looped)


@LAYERS_BUILT
def test_the_one_call_refuses_a_part_it_lacks_by_layer_and_place():
    from pipeline.kernels.decode_layers import PER_LAYER
    any_tensor = torch.zeros(2, 8)
    parts = [any_tensor] * PER_LAYER
    parts[2] = None  # layer 0's keys
    with pytest.raises(RuntimeError, match="layer 0 lacks part 2"):
        LAYERS.registered("decode_layers")(any_tensor, parts, [0] * 4, [8] * 4, [1e-6] * 2,
                                           f"{GLUE.name};{ORDERED.name};;;;;", any_tensor, any_tensor,
                                           torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long), 2, 1, 1,
                                           1.0)


@LAYERS_BUILT
def test_int8_linears_switched_to_another_kernel_loop_in_python_and_back():
    """The one call multiplies by the VNNI kernel's copies; a benchmark switching the int8 Linears to fbgemm
    (profiling's `fbgemm-int8` baseline) gets the Python loop, which calls their forward, and the one call back
    after."""
    if vnni_int8.EXTENSION.ops() is None:
        pytest.skip("the VNNI int8 kernel is not built for this CPU")
    model = qwen2("int8-dynamic", TINY, layers=2)
    runner = prefilled_runner(model, [7])
    int8 = [m for m in model.modules() if isinstance(m, Int8DynamicLinear)]
    assert runner.fast_step.layers_in_one_call and {m.kernel for m in int8} == {"vnni"}
    int8[0].use_kernel("int_mm", keep=True)
    assert not runner.fast_step.layers_in_one_call
    steps_agree(model, [7], slots=2, steps=1, one_call=False)
    int8[0].use_kernel("vnni", keep=True)
    assert runner.fast_step.layers_in_one_call


@LAYERS_BUILT
@pytest.mark.parametrize("variant", ["int8-dynamic", "int4-dynamic"])
def test_quantized_linears_on_the_avx2_kernels_run_in_the_one_call_with_the_model_forwards_bits(variant):
    """As on an AVX2-only CPU: every quantized Linear multiplies with pipeline.kernels.avx2_int8 or avx2_int4, and
    the one call calls those ops (the profiler sees them) and gives the model forward's bits."""
    from pipeline.kernels import avx2_int4, avx2_int8
    if avx2_int8.EXTENSION.ops() is None or avx2_int4.EXTENSION.ops() is None:
        pytest.skip("the AVX2 kernels are not built here")
    model = qwen2(variant, TINY, layers=2)
    for module in model.modules():
        if isinstance(module, (Int8DynamicLinear, Int4DynamicLinear)):
            assert module.use_kernel("avx2") == "avx2"
    steps_agree(model, [7, 12], slots=2, steps=2, one_call=True)
    runner = prefilled_runner(model, [7, 12])
    ops = [op[0] for op in profiled_ops(runner.fast_step, torch.ones(2, 1, dtype=torch.long), torch.tensor([7, 12]),
                                        2 * CHUNK)]
    avx2 = [op for op in ops if op in ("avx2_linear", "avx2_int4_linear")]
    assert len(avx2) == 2 * 4 + 1 and not {"vnni_linear", "vnni_int4_linear"} & set(ops)  # four a layer, the output


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_the_fast_step_gives_the_model_forwards_bits_at_qwen_05b_width(variant):
    model = qwen2(variant, QWEN_05B, layers=1)
    steps_agree(model, [5], slots=2, steps=2)
    steps_agree(model, [CHUNK + 9, 4, 30], slots=4, steps=2)


def test_the_fast_step_gives_the_model_forwards_bits_with_its_linears_unfused(monkeypatch):
    from pipeline import precision
    from pipeline.kernels.batch_invariance import RowInvariantLinear
    monkeypatch.setattr(precision, "fuse_linears", lambda model: 0)  # as make_batch_invariant alone leaves a model
    model = qwen2("float32", TINY, layers=2)
    assert type(model.model.layers[0].self_attn.q_proj) is RowInvariantLinear
    steps_agree(model, [7], slots=4)
    steps_agree(model, [CHUNK + 9, 4, 30], slots=4)


def test_the_runner_takes_the_fast_step_only_for_a_batch_invariant_qwen2_on_the_cpu(generator):
    assert isinstance(ModelRunner(generator.model, SlotRule(2, 2 * CHUNK, CHUNK)).fast_step, Qwen2DecodeStep)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    plain = Qwen2ForCausalLM(Qwen2Config(**TINY, num_hidden_layers=1, vocab_size=VOCAB)).eval()
    assert qwen2_decode_step(plain, ModelRunner(plain, SlotRule(2, 2 * CHUNK, CHUNK)).table) is None


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=BF16_CPU)])
def test_the_steps_attention_gives_flash_chunked_attentions_bits_even_where_a_row_sees_nothing(dtype):
    rows, kv_heads, group, dim, width = 5, 2, 3, 16, 3 * CHUNK
    stream = torch.Generator().manual_seed(3)
    q = torch.randn(rows, kv_heads * group, 1, dim, generator=stream).to(dtype)
    key, value = (torch.randn(rows, kv_heads, width, dim, generator=stream).to(dtype) for _ in range(2))
    value[3, :, 5] = float("nan")  # a row that sees a NaN: NaN out, with the same bits
    ends = torch.tensor([width - 1, 0, CHUNK + 3, 40, -1])  # the last row sees no key at all
    visible = (torch.arange(width) <= ends[:, None])[:, None, None, :]
    expected = flash_chunked_attention(q, key, value, visible, scaling=dim ** -0.5)
    bias, unseen = chunk_masks(visible, dtype, kv_heads)
    # as the step cuts them from the slot table: a slot's kv heads one capacity (here width) apart
    keys, values = (t.view(rows * kv_heads, width // CHUNK, CHUNK, dim) for t in (key, value))
    got = decode_attention(q.view(rows, kv_heads, group, dim), keys, values, bias, unseen, dim ** -0.5)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(got.reshape(expected.shape).view(bits), expected.view(bits))
    assert got[4].eq(0).all() and got[3].isnan().any() and got[:3].isfinite().all()
    assert chunk_masks(visible[:1], dtype, kv_heads)[1] is None  # the longest row sees every chunk: nothing to fill


def prefilled_runner(model, lengths: list[int]) -> ModelRunner:
    """A runner of len(lengths) slots of up to 4 chunks, slot i prefilled with a prompt of lengths[i] tokens."""
    runner = ModelRunner(model, SlotRule(len(lengths), len(lengths) * 4 * CHUNK, CHUNK))
    with torch.inference_mode():
        for slot, n in enumerate(lengths):
            seq = SequenceState(slot, [1 + i % (VOCAB - 1) for i in range(n)], 8)
            runner.table.join(slot, seq.prompt_ids, seq.budget_tokens, seq.sampling)
            runner.prefill_chunk(seq, 0, n)
    return runner


def attention_calls(step, ids, columns, width: int) -> tuple[int, int]:
    """How many calls of SDPA's CPU flash kernel and of the ordered kernel one step makes."""
    from profiling.lib.engine_step import OpCounter
    counter = OpCounter()
    with torch.inference_mode(), counter.mode:
        step(ids, columns, width)
    return counter.counts["_scaled_dot_product_flash_attention_for_cpu"], counter.counts["ordered_attention"]


@pytest.mark.parametrize("attention", ATTENTION)
def test_the_step_attends_over_every_chunk_in_one_flash_call_a_layer_or_runs_the_ordered_kernel(attention, monkeypatch):
    attention_kernel(attention, monkeypatch)
    expected = (3, 0) if attention == "chunked" else (0, 3)  # one call a layer: flash's, or the ordered kernel's
    model = qwen2("float32", TINY, layers=3)
    runner = prefilled_runner(model, [3 * CHUNK + 5, 20])
    columns = torch.tensor([3 * CHUNK + 5, 20])
    assert attention_calls(runner.fast_step, torch.ones(2, 1, dtype=torch.long), columns, 4 * CHUNK) == expected
    assert attention_calls(runner.fast_step, torch.ones(1, 1, dtype=torch.long), columns[:1], 4 * CHUNK) == expected


@ORDERED_BUILT
@pytest.mark.parametrize("variant", ["float32", pytest.param("bfloat16", marks=BF16_CPU)])
def test_the_ordered_step_reads_no_key_past_a_rows_own_column(variant):
    """Each row attends over its own keys only, however wide the step: NaN in every slot-table column past a
    row's column (another row's longer keys, a wider bucket) changes none of its bits."""
    model = qwen2(variant, TINY, layers=2)
    lengths = [3 * CHUNK + 5, 20]
    runner = prefilled_runner(model, lengths)
    with torch.inference_mode():
        columns, ids = torch.tensor(lengths), torch.ones(2, 1, dtype=torch.long)
        saved = [t.clone() for t in (*runner.table.keys.values(), *runner.table.values.values())]
        clean = runner.fast_step(ids, columns, 4 * CHUNK).clone()
        for buffer, copy in zip((*runner.table.keys.values(), *runner.table.values.values()), saved):
            buffer.copy_(copy)
            for slot, n in enumerate(lengths):
                buffer[slot, :, n + 1:] = float("nan")  # past the key this step writes at column n
        noisy = runner.fast_step(ids, columns, 4 * CHUNK)
    assert clean.isfinite().all() and torch.equal(noisy, clean)


@GLUE_BUILT
@pytest.mark.parametrize("glue", ["glue", "torch"])
def test_the_glue_is_one_call_a_norm_with_the_add_before_it_one_a_layers_rotary_and_cache_writes_and_one_its_silu(
        glue, monkeypatch):
    glue_kernel(glue, monkeypatch)
    from profiling.lib.engine_step import OpCounter
    layers = 3
    runner = prefilled_runner(qwen2("bfloat16", TINY, layers=layers), [CHUNK + 5, 20])
    counter = OpCounter()
    with torch.inference_mode(), counter.mode:
        runner.fast_step(torch.ones(2, 1, dtype=torch.long), torch.tensor([CHUNK + 5, 20]), 2 * CHUNK)
    ops = counter.counts
    glued = glue == "glue"
    # the first norm alone, every other one with the residual add before it (the final norm's too)
    assert (ops["rms_norm"], ops["add_rms_norm"], ops["rotate_and_store"], ops["silu_mul"]) == (
        (1, 2 * layers, layers, layers) if glued else (0, 0, 0, 0))
    # the torch ops they replace: the rsqrt, the rotary's roll, the cache writes, the gate and up split
    assert (ops["rsqrt_"], ops["roll"], ops["index_copy_"]) == ((0, 0, 0) if glued else (2 * layers + 1, layers, 2 * layers))
    assert ops["split_with_sizes"] == (layers if glued else 2 * layers)  # q, k and v's split stays
