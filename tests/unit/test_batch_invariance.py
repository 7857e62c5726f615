"""Batch invariance at the decode step that serves, at the LLM's real width: a row's logits alone are the
same bits as the same row's among mixed, bucketed batch-mates, per precision and device; and the pieces
that make it so: per-row reductions, the RMSNorm swap, attention tiles, the Linears at several thread
counts, an encoder's unpadded batch, the embedder's normalisation.

The model is Qwen2.5-0.5B-Instruct's shape (hidden 896, 14 heads, 2 kv heads, intermediate 4864) with
random weights, one layer and a small vocabulary, so that it stays fast.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.continuous.runner import ModelRunner
from pipeline.continuous.scheduler import SequenceState
from pipeline.continuous.slots import SlotRule
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.kernels.batch_invariance import (
    CUDA_TILE_ROWS,
    PackedBf16Linear,
    RowInvariantLinear,
    RowInvariantRMSNorm,
    make_linears_row_invariant,
    make_norms_row_invariant,
    per_row,
)
from pipeline.kernels.chunked_attention import CHUNK, TILE_ROWS, matmul_chunked_attention
from pipeline.precision import apply_precision
from pipeline.precision_policy import LOAD_DTYPE

# A float Linear made row-invariant: oneDNN's, or on a CPU with AVX-512 BF16 a bfloat16 one through the project's kernel.
ROW_INVARIANT_LINEARS = (RowInvariantLinear, PackedBf16Linear)
ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where torch sees one")
BF16_CPU = pytest.mark.skipif(not cpu_supports_bf16(), reason="this CPU has no avx512_bf16 or AMX: bfloat16 is "
                                                              "emulated here, and PRECISION=auto picks float32")
# Every variant a CPU is offered but float16 (pipeline/precision_policy.py), and CUDA's two.
PLACED = [pytest.param(("cpu", "float32"), id="cpu-float32"),
          pytest.param(("cpu", "bfloat16"), id="cpu-bfloat16", marks=BF16_CPU),
          pytest.param(("cpu", "int8-dynamic"), id="cpu-int8-dynamic"),
          pytest.param(("cpu", "int8-weight"), id="cpu-int8-weight", marks=BF16_CPU),
          pytest.param(("cpu", "int4-dynamic"), id="cpu-int4-dynamic"),
          pytest.param(("cpu", "int4-weight"), id="cpu-int4-weight", marks=BF16_CPU),
          pytest.param(("cuda", "bfloat16"), id="cuda-bfloat16", marks=ON_CUDA),
          pytest.param(("cuda", "float16"), id="cuda-float16", marks=ON_CUDA)]
QWEN_05B = {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
            "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "tie_word_embeddings": True}
VOCAB = 512


def qwen_shaped_llm(variant: str, device: str, layers: int = 1):
    """A Qwen2 decoder of Qwen2.5-0.5B's width with random weights, in `variant` as the service loads it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN_05B, num_hidden_layers=layers, vocab_size=VOCAB, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).to(getattr(torch, LOAD_DTYPE[variant])).to(device).eval()
    return apply_precision(model, variant)


def decode_step_logits(model, prompts: list[list[int]], device: str) -> torch.Tensor:
    """The logits (rows, vocab) of one decode step of `prompts` together, as the engine's runner serves
    it: each prompt prefilled alone into its slot of the slot table, then one step of all the rows,
    bucketed as on CUDA (5 prompts run as 8 rows, 9 as 16: the prompts' rows first, then spare rows
    idle in free slots). On CUDA the step is replayed from its recorded graph; on the CPU it runs
    eagerly, bucketed alike.

    The one place this file drives the engine (pipeline.continuous.runner)."""
    runner = ModelRunner(model, SlotRule(16, 16 * 4 * CHUNK, CHUNK), device=device)
    logits = []

    class EagerBucketed:  # what DecodeGraphs does, with no graph: rows bucketed, the eager step
        def run(self, ids, columns, width, layout=None):
            return runner._forward(ids, columns, width)

    graphs = runner.graphs or EagerBucketed()
    step = graphs.run

    def run(ids, columns, width, layout=None):
        out = step(ids, columns, width, layout)
        logits.append(out.clone())  # a graph's output is overwritten at its next replay
        return out

    graphs.run = run
    runner.graphs = graphs
    seqs = [SequenceState(seq_id, prompt, 4) for seq_id, prompt in enumerate(prompts)]
    for seq in seqs:  # each prompt prefilled into its own slot
        runner.table.join(seq.seq_id, seq.prompt_ids, seq.budget_tokens, seq.sampling)
        seq.generated.append(runner.prefill_chunk(seq, 0, seq.prompt_len))
    runner.decode(seqs)
    assert len(logits) == 1
    return logits[0]


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("placed", PLACED)
def test_a_rows_decode_logits_alone_equal_its_logits_in_mixed_bucketed_batches(placed):
    device, variant = placed
    model = qwen_shaped_llm(variant, device)
    target = _prompt(24, seed=1)  # one chunk of keys alone; beside the long row, a padding chunk too
    short = [_prompt(3 + 6 * (i % 2), seed=10 + i) for i in range(8)]  # few lengths: few shapes to prepare
    long = _prompt(CHUNK + 9, seed=9)
    alone = decode_step_logits(model, [target], device)[0]
    assert alone.isfinite().all() and alone.std() > 0
    # 5 rows (run as 8), 8 rows, 9 rows (run as 16): the target first, in the middle, last; beside a row
    # of two chunks in the last two
    for batch, at in (([target] + short[:4], 0), (short[:2] + [long, target] + short[2:6], 3),
                      (short[:7] + [long, target], 8)):
        got = decode_step_logits(model, batch, device)
        assert torch.equal(got[at], alone), f"{len(batch)} rows, the row at {at}"


def prefilled_logits(model, prompt: list[int], cuts: list[int], device: str) -> torch.Tensor:
    """The first token's logits of `prompt` prefilled by the engine's runner in pieces at `cuts` (0 first, the
    prompt's length last), each piece one forward over the slot table as the engine runs it."""
    runner = ModelRunner(model, SlotRule(1, 4 * CHUNK, CHUNK), device=device)
    seq = SequenceState(0, prompt, 4)
    runner.table.join(seq.seq_id, seq.prompt_ids, seq.budget_tokens, seq.sampling)
    chosen = runner._choose
    logits = []
    runner._choose = lambda rows_logits, *args: logits.append(rows_logits.clone()) or chosen(rows_logits, *args)
    for start, end in zip(cuts, cuts[1:]):
        runner.prefill_chunk(seq, start, end)
    assert len(logits) == 1
    return logits[0][0]


CPU_PLACED = [param for param in PLACED if param.values[0][0] == "cpu"]


@pytest.mark.parametrize("placed", CPU_PLACED)
def test_a_prompt_prefilled_in_chunks_on_the_cpu_gets_the_whole_prompts_bits(placed):
    """The engine prefills a prompt in chunks at the multiples of GENERATE_PREFILL_CHUNK, the reference whole:
    the first token's logits must be the same bits (two layers, so that the second reads keys the first wrote
    in chunks). 49 tokens cut in eights and at uneven places."""
    device, variant = placed
    model = qwen_shaped_llm(variant, device, layers=2)
    prompt = _prompt(49, seed=4)
    whole = prefilled_logits(model, prompt, [0, 49], device)
    assert whole.isfinite().all() and whole.std() > 0
    for cuts in ([0, 8, 16, 24, 32, 40, 49], [0, 5, 23, 47, 49], [0, 16, 32, 49]):
        assert torch.equal(prefilled_logits(model, prompt, cuts, device), whole), cuts


def test_the_steps_here_are_bucketed_as_on_a_gpu():
    model = qwen_shaped_llm("int8-dynamic", "cpu")
    rows = [decode_step_logits(model, [_prompt(3 + i, seed=i) for i in range(n)], "cpu").shape for n in (1, 5, 9)]
    assert rows == [(1, VOCAB), (8, VOCAB), (16, VOCAB)]


# ----------------------------------------------------------------------------- the pieces

def test_the_cpu_reduces_each_row_alone_at_any_thread_count():
    """What per_row leaves to torch on the CPU: a row's mean of squares (RMSNorm's) and its length (a
    normalisation) are the same bits alone and among any number of rows, at 1, 2 and 8 threads."""
    threads = torch.get_num_threads()
    x = torch.randn(600, 896, generator=torch.Generator().manual_seed(0)) * 3
    try:
        for n in (1, 2, 8):
            torch.set_num_threads(n)
            for dtype in (torch.float32, torch.bfloat16):
                rows = x.to(dtype).float()
                alone = torch.cat([per_row(rows[i:i + 1], lambda t: t.pow(2).mean(-1, keepdim=True))
                                   for i in range(24)])
                lengths = torch.cat([rows[i:i + 1].norm(dim=-1, keepdim=True) for i in range(24)])
                for count in (2, 7, 16, 37, 600):  # 37 x 896 and more: enough work to be split across threads
                    assert torch.equal(per_row(rows[:count], lambda t: t.pow(2).mean(-1, keepdim=True))[:24],
                                       alone[:count]), (n, dtype, count)
                    assert torch.equal(rows[:count].norm(dim=-1, keepdim=True)[:24], lengths[:count]), (n, count)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA)])
def test_per_row_launches_tiles_of_one_shape_on_cuda_and_gives_each_row_its_bits_alone(device):
    shapes = []

    def mean_of_squares(t):
        shapes.append(tuple(t.shape))
        return t.pow(2).mean(-1, keepdim=True)

    x = torch.randn(2 * CUDA_TILE_ROWS + 5, 3, 896, generator=torch.Generator().manual_seed(1)).to(device)
    alone = torch.cat([per_row(x[i:i + 1], mean_of_squares) for i in range(x.shape[0])])
    shapes.clear()
    got = per_row(x, mean_of_squares)
    assert got.shape == (x.shape[0], 3, 1) and torch.equal(got, alone)
    if device == "cuda":
        assert shapes == [(CUDA_TILE_ROWS, 896)] * -(-x[..., 0].numel() // CUDA_TILE_ROWS)  # the last one padded
    else:
        assert shapes == [tuple(x.shape)]  # the CPU's reduction is row-invariant as it is: one call
    assert per_row(x[:0], mean_of_squares).shape == (0, 3, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rmsnorm_swap_keeps_transformers_bits_and_takes_every_norm(dtype):
    model = qwen_shaped_llm("float32", "cpu", layers=2)
    norms = [m for m in model.modules() if isinstance(m, RowInvariantRMSNorm)]
    assert len(norms) == 2 * 2 + 1  # input and post-attention norms per layer, and the final norm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    theirs = Qwen2RMSNorm(896, eps=1e-6).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(torch.rand(896) + 0.5)
    x = torch.randn(5, 7, 896).to(dtype)
    want = theirs(x)
    assert make_norms_row_invariant(torch.nn.Sequential(theirs)) == 1 and type(theirs) is RowInvariantRMSNorm
    assert torch.equal(theirs(x), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA)])
def test_matmul_attention_runs_in_tiles_each_row_as_alone(device):
    """More rows than a tile, of mixed lengths: each row's bits alone (where it is a tile of one real row).
    The CPU in tiles of 4 rows (less padding to compute), CUDA in its own."""
    tile = 4 if device == "cpu" else TILE_ROWS
    lengths = ([1, 5, CHUNK + 3, 40, 2, 9, 700, 31, 3, 17, 260] * 4)[:tile + 3]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(5)
    width = max(lengths)
    query = torch.randn(len(lengths), 14, 1, 64, generator=g).to(dtype).to(device)
    key, value = (torch.randn(len(lengths), 2, width, 64, generator=g).to(dtype).to(device) for _ in range(2))
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :].to(device)
    batch = matmul_chunked_attention(query, key, value, mask, scaling=0.125, tile_rows=tile)
    for row, n in enumerate(lengths):
        alone = matmul_chunked_attention(query[row:row + 1], key[row:row + 1, :, :n], value[row:row + 1, :, :n],
                                         scaling=0.125, tile_rows=tile)
        assert torch.equal(alone[0], batch[row]), f"row of {n} keys"


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), pytest.param("cpu", torch.bfloat16, marks=BF16_CPU),
                                           pytest.param("cuda", torch.bfloat16, marks=ON_CUDA)])
def test_the_row_invariant_linear_at_1_2_and_8_threads(device, dtype):
    """Qwen2.5-0.5B's up and down projections: each row's bits alone and among 2 to 64 rows, whatever
    torch's thread count (oneDNN splits the rows, or the columns, across threads)."""
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(2)
    try:
        for k, n in ((896, 4864), (4864, 896)):
            model = torch.nn.Sequential(torch.nn.Linear(k, n).to(dtype)).to(device)
            assert make_linears_row_invariant(model) == 1
            layer = model[0]
            assert type(layer) in ROW_INVARIANT_LINEARS
            x = torch.randn(64, k, generator=g).to(dtype).to(device)
            for count in (1, 2, 8):
                torch.set_num_threads(count)
                with torch.no_grad():
                    alone = torch.cat([layer(x[i:i + 1]) for i in range(12)])
                    for rows in (2, 3, 5, 8, 12, 17, 64):
                        got = layer(x[:rows])[:12]
                        assert torch.equal(got, alone[:rows]), (k, n, count, rows)
    finally:
        torch.set_num_threads(threads)


def test_the_embedder_normalises_its_pooled_vectors_in_numpy_and_not_in_the_model(embedder):
    """The model's own Normalize (torch's norm, on CUDA summed by the row count) is gone; the vectors are
    still the pooled ones at unit length."""
    assert not [m for m in embedder.model if type(m).__name__ == "Normalize"]
    texts = ["Where is my order?", "How do I return a defective product? " * 5, "hi"]
    got = embedder.embed(texts)
    pooled = embedder.model.encode(texts, convert_to_tensor=True, normalize_embeddings=False)
    want = torch.nn.functional.normalize(pooled.float(), dim=1).numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)


def test_an_encoders_linears_run_in_larger_gpu_tiles_than_a_decoders():
    """An encoder's rows are its batch's tokens (hundreds to thousands), a decoder's decode step a few:
    each model's Linears get one tile size, so every launch of that model has one shape."""
    from pipeline.kernels.batch_invariance import ENCODER_CUDA_TILE_ROWS, make_batch_invariant
    encoder = small_bert()
    make_batch_invariant(encoder)
    decoder = qwen_shaped_llm("float32", "cpu", layers=1)
    for model, tile in ((encoder, ENCODER_CUDA_TILE_ROWS), (decoder, CUDA_TILE_ROWS)):
        linears = [m for m in model.modules() if isinstance(m, RowInvariantLinear)]
        assert linears and {m.cuda_tile_rows for m in linears} == {tile}, type(model).__name__
    assert ENCODER_CUDA_TILE_ROWS > CUDA_TILE_ROWS


@pytest.fixture
def cudnn_attention_switch():
    """torch's process-wide cuDNN attention switch, on before the test and as it was after."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def small_bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128, num_hidden_layers=1,
                                vocab_size=128, max_position_embeddings=64)).eval()


def test_a_forwards_layers_read_their_masks_key_runs_once(monkeypatch):
    """Every layer gets the forward's one mask; its runs are read back once (device syncs on a GPU)."""
    from transformers import BertConfig, BertModel

    from pipeline.kernels import batch_invariance
    from pipeline.kernels.batch_invariance import make_batch_invariant
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128, num_hidden_layers=3,
                                   vocab_size=128, max_position_embeddings=64)).eval()
    make_batch_invariant(encoder)
    computed = []
    key_runs = batch_invariance._key_runs
    monkeypatch.setattr(batch_invariance, "_key_runs", lambda mask: computed.append(mask) or key_runs(mask))
    ids = torch.randint(1, 128, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 15:] = 0
    with torch.inference_mode():  # as the stages serve: masks without a version count
        batched = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        assert len(computed) == 1  # three layers, one read
        alone = encoder(input_ids=ids[:1, :7], attention_mask=mask[:1, :7]).last_hidden_state
        encoder(input_ids=ids, attention_mask=mask)
    assert len(computed) == 2  # the next forward's mask is its own (the lone row needs none)
    assert torch.equal(batched[0, :7], alone[0])


def test_a_mask_changed_in_place_has_its_runs_read_again():
    from pipeline.kernels.batch_invariance import _row_key_runs
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    mask[0, ..., 4:] = False
    assert _row_key_runs(mask) == [(0, 4), (0, 6)]
    mask[1, ..., :2] = False  # left padding now: the same tensor, a new version
    assert _row_key_runs(mask) == [(0, 4), (2, 6)]
    assert _row_key_runs(mask.clone()) == [(0, 4), (2, 6)]


def test_a_model_made_invariant_on_the_cpu_leaves_the_process_attention_backends_alone(cudnn_attention_switch):
    from pipeline.kernels.batch_invariance import make_batch_invariant
    make_batch_invariant(small_bert())
    assert torch.backends.cuda.cudnn_sdp_enabled()


@ON_CUDA
def test_an_encoder_on_cuda_attends_without_cudnn_which_builds_a_plan_per_new_shape(cudnn_attention_switch):
    """Each row attends at its own length, so nearly every request brings a shape cuDNN has not planned for."""
    from torch.autograd import DeviceType

    from pipeline.kernels.batch_invariance import make_batch_invariant
    encoder = small_bert().to(torch.bfloat16).cuda()
    make_batch_invariant(encoder)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    ids = torch.randint(1, 128, (2, 53), generator=torch.Generator().manual_seed(3)).cuda()
    mask = torch.ones_like(ids)
    mask[0, 37:] = 0  # rows of 37 and 53 tokens
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        encoder(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert kernels and not [k for k in kernels if "cudnn" in k.lower()]


@ON_CUDA
def test_a_row_invariant_linear_launches_tiles_of_its_own_size_on_cuda(monkeypatch):
    linear = torch.nn.Linear(896, 128).to(torch.bfloat16).cuda()
    make_linears_row_invariant(torch.nn.Sequential(linear))
    linear.cuda_tile_rows = 256
    x = torch.randn(600, 896, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).cuda()
    shapes = []
    plain = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda t, *a: shapes.append(tuple(t.shape)) or plain(t, *a))
    got = linear(x)
    monkeypatch.undo()
    assert shapes == [(256, 896)] * 3
    assert all(torch.equal(linear(x[i:i + 1])[0], got[i]) for i in (0, 255, 256, 599))


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), pytest.param("cpu", torch.bfloat16, marks=BF16_CPU),
                                           pytest.param("cuda", torch.bfloat16, marks=ON_CUDA)])
def test_an_encoders_row_alone_equals_the_row_among_unpadded_batch_mates(device, dtype):
    """Rows of one length need no padding: one attention call for the batch on the CPU, a call per row
    on CUDA (FlashAttention's split of the keys follows rows x heads). 300 tokens: several key blocks."""
    from transformers import BertConfig, BertModel

    from pipeline.kernels.batch_invariance import make_batch_invariant
    torch.manual_seed(0)
    config = BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=1024, num_hidden_layers=1,
                        vocab_size=512, max_position_embeddings=512)
    model = BertModel(config).to(dtype).to(device).eval()
    make_batch_invariant(model)
    ids = torch.randint(1, 512, (6, 300), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.inference_mode():
        batch = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        for row in range(ids.shape[0]):
            alone = model(input_ids=ids[row:row + 1], attention_mask=torch.ones_like(ids[row:row + 1]))
            assert torch.equal(alone.last_hidden_state[0], batch[row]), row


class _CausalAttention(torch.nn.Module):
    """What transformers' attention hands the attention function: Qwen2.5-0.5B's 14 query heads on 2 key heads."""
    is_causal = True
    num_key_value_groups = 7


@pytest.mark.parametrize("device, dtype", [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16", marks=BF16_CPU),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=ON_CUDA),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=ON_CUDA)])
def test_a_prompts_chunks_give_its_queries_the_bits_of_the_whole_prompt(cudnn_attention_switch, device, dtype):
    """The engine prefills a prompt in chunks (at the multiples of GENERATE_PREFILL_CHUNK), the reference whole:
    every query's attention must come out as in the whole prompt's one call: on the CPU through the ordered kernel,
    on CUDA on SDPA's kernels without cuDNN. 301 queries, cut as the engine cuts and unevenly."""
    from pipeline.kernels.batch_invariance import _batch_invariant_sdpa, attend_without_cudnn
    if device == "cuda":
        attend_without_cudnn()
    gen = torch.Generator(device=device).manual_seed(5)
    query, key, value = (torch.randn(1, heads, 301, 64, generator=gen, device=device, dtype=dtype)
                         for heads in (14, 2, 2))
    module = _CausalAttention()
    whole, _ = _batch_invariant_sdpa(module, query, key, value, None, scaling=0.125)
    for cuts in ([0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 301], [0, 45, 101, 230, 300, 301]):
        chunks = []
        for start, end in zip(cuts, cuts[1:]):
            mask = None if start == 0 else (torch.arange(end, device=device)[None, :]
                                            <= torch.arange(start, end, device=device)[:, None])[None, None]
            out, _ = _batch_invariant_sdpa(module, query[:, :, start:end], key[:, :, :end], value[:, :, :end], mask,
                                           scaling=0.125)
            chunks.append(out)
        assert torch.equal(torch.cat(chunks, dim=1), whole), cuts
