"""Precision variants: settings, the int8 Linears against float32, and batch invariance per variant.

Each variant's stage models are tiny stand-ins loaded once per module; a request's result
must not depend on the requests that share its batch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.continuous import ContinuousEngine
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.device import Placement, placement_for
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest
from pipeline.kernels.batch_invariance import BATCH_INVARIANT_ATTENTION, PackedBf16Linear, RowInvariantLinear
from pipeline.kernels.int4 import Int4DynamicLinear, Int4WeightLinear
from pipeline.kernels.int8 import Int8DynamicLinear, Int8WeightLinear, quantize_rows
from pipeline.precision_policy import FAST, LOAD_DTYPE
from pipeline.reranker import RerankRequest
from tests.helpers import run_joining

# Every variant the policy may pick on a CPU; alone and batched must agree to the last bit in each.
QUANTIZED_LINEARS = (Int8DynamicLinear, Int8WeightLinear, Int4DynamicLinear, Int4WeightLinear)
VARIANTS = ("float32", "bfloat16", "int8-dynamic", "int8-weight", "int4-dynamic", "int4-weight")
QUERIES = list(spec.REFERENCE_QUERIES)
TEXTS = ["ok", "Answer: you can return it within 30 days for a refund.",
         "Answer: " + "the package is delayed because of the weather and the carrier. " * 20]
CPU = {"cuda_available": lambda: False}
ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where torch sees one")
BF16_CPU = pytest.mark.skipif(not cpu_supports_bf16(), reason="this CPU has no avx512_bf16 or AMX: bfloat16 is "
                                                              "emulated here, and oneDNN refuses its packed products")
# (device, variant) per stages fixture: every CPU variant, and every CUDA variant where a GPU is.
CUDA_VARIANTS = ("bfloat16", "float16")
PLACEMENTS = [pytest.param(("cpu", v), id=v, marks=[BF16_CPU] if v == "bfloat16" else []) for v in VARIANTS] + [
    pytest.param(("cuda", v), id=f"cuda-{v}", marks=ON_CUDA) for v in CUDA_VARIANTS]


# ----------------------------------------------------------------------------- settings

def _placement(env: dict, stage: str, bf16: bool = True, **detectors) -> Placement:
    """A stage's placement on a CPU described by `bf16` and `detectors` (a CPU that packs bfloat16 and
    sums int8 exactly unless they say otherwise), not on this one."""
    machine = {"packs_bf16": lambda: True, "int8_cpu": lambda: True, "int4_cpu": lambda: True}
    return placement_for(Settings.from_env(env), stage, bf16_cpu=lambda: bf16, **{**CPU, **machine, **detectors})


def test_auto_is_bfloat16_where_the_cpu_has_it_and_fast_follows_the_hardware_table():
    assert _placement({}, "generate") == Placement("cpu", "bfloat16", "bfloat16")  # auto, the default
    assert _placement({"PRECISION": "auto"}, "generate", bf16=False) == Placement("cpu", "float32", "float32")
    for bf16, kind in ((True, "cpu-bf16"), (False, "cpu")):
        for stage, variant in FAST[kind].items():
            p = _placement({"PRECISION": "fast"}, stage, bf16=bf16)
            assert (p.precision, p.dtype) == (variant, LOAD_DTYPE[variant])
    assert set(FAST) == {"cpu-bf16", "cpu", "cuda"}  # a CPU with AMX is held to avx512_bf16: no row of its own
    cuda = placement_for(Settings.from_env({"PRECISION": "fast"}), "embed", cuda_available=lambda: True,
                         bf16_cpu=lambda: True, cuda_bf16=lambda: True)
    assert (cuda.device, cuda.precision) == ("cuda", FAST["cuda"]["embed"])


def test_per_stage_precision_overrides_precision():
    env = {"PRECISION": "fast", "RERANK_PRECISION": "float32", "EMBED_PRECISION": "int8-weight",
           "SENTIMENT_PRECISION": "BFloat16"}
    assert _placement(env, "rerank") == Placement("cpu", "float32", "float32")
    assert _placement(env, "embed") == Placement("cpu", "bfloat16", "int8-weight")
    assert _placement(env, "sentiment") == Placement("cpu", "bfloat16", "bfloat16")
    assert _placement(env, "toxicity").precision == FAST["cpu-bf16"]["toxicity"]
    s = Settings.from_env(env)
    assert s.stage_precision_variable("embed") == "EMBED_PRECISION"
    assert s.stage_precision_variable("generate") == "PRECISION"


def test_bad_precision_values_are_one_line_errors_naming_the_variable():
    with pytest.raises(ConfigError, match=r"^PRECISION='int8' is not valid: expected one of auto, fast, float32, "
                                          r"bfloat16, float16, int8-dynamic, int8-weight, int4-dynamic, int4-weight$"):
        Settings.from_env({"PRECISION": "int8"})
    with pytest.raises(ConfigError, match=r"^GENERATE_PRECISION='float16' is not valid on the CPU: expected auto, "
                                          r"fast, float32, bfloat16, int8-dynamic, int8-weight, int4-dynamic, int4-weight$"):
        _placement({"GENERATE_PRECISION": "float16"}, "generate")


@pytest.mark.parametrize("env,named,instead", [
    ({"DTYPE": "float32"}, "DTYPE='float32'", "set PRECISION instead"),
    ({"RERANK_DTYPE": "bfloat16"}, "RERANK_DTYPE='bfloat16'", "set RERANK_PRECISION instead"),
    ({"PRECISION": "exact"}, "PRECISION='exact'", "'exact' was removed: use auto"),
    ({"EMBED_PRECISION": "exact"}, "EMBED_PRECISION='exact'", "'exact' was removed: use auto"),
])
def test_the_removed_dtype_settings_and_exact_refuse_to_start_naming_what_replaced_them(env, named, instead):
    with pytest.raises(ConfigError) as error:
        Settings.from_env(env)
    assert len(error.value.problems) == 1
    assert error.value.problems[0].startswith(named) and instead in error.value.problems[0]


def test_a_variant_the_device_cannot_run_is_refused_at_startup():
    gpu = {"cuda_available": lambda: True, "cuda_bf16": lambda: False}
    s = Settings.from_env({"GENERATE_PRECISION": "int8-dynamic"})
    with pytest.raises(ConfigError, match=r"^GENERATE_PRECISION='int8-dynamic' is not valid on this CUDA device: "
                                          r"expected auto, fast, float16$"):
        placement_for(s, "generate", bf16_cpu=lambda: True, **gpu)
    # CUDA is offered neither float32 (not batch-invariant there) nor int8 (slower than bfloat16 there)
    for variant in ("float32", "int8-dynamic", "int8-weight", "int4-dynamic", "int4-weight"):
        with pytest.raises(ConfigError, match=rf"^PRECISION='{variant}' is not valid on this CUDA device: "
                                              r"expected auto, fast, bfloat16, float16$"):
            placement_for(Settings.from_env({"PRECISION": variant}), "rerank", bf16_cpu=lambda: True,
                          cuda_available=lambda: True, cuda_bf16=lambda: True)
    with pytest.raises(ConfigError, match="PRECISION='bfloat16' is not valid on this CUDA device"):
        placement_for(Settings.from_env({"EMBED_PRECISION": "bfloat16"}), "embed",
                      bf16_cpu=lambda: True, **gpu)
    # fast on that GPU falls back to auto's choice (float16 there), not to an error
    assert placement_for(Settings.from_env({"PRECISION": "fast"}), "embed", bf16_cpu=lambda: True,
                         **gpu) == Placement("cuda", "float16", "float16")


# ----------------------------------------------------------------------------- the int8 Linears

def _linear(k: int = 96, n: int = 80, bias: bool = True, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(k, n, bias=bias).to(dtype)


@pytest.mark.parametrize("make, dtype, bound", [(Int8DynamicLinear, torch.float32, 0.02),
                                                (Int8WeightLinear, torch.bfloat16, 0.03)])
def test_quantized_linear_is_close_to_float32(make, dtype, bound):
    linear = _linear()
    x = torch.randn(3, 7, 96)
    expected = linear(x)
    got = make(_linear(dtype=dtype))(x.to(dtype)).float()
    assert got.shape == expected.shape
    rel = (got - expected).norm() / expected.norm()
    assert 1e-5 < rel < bound  # quantized (not the float path by accident), yet close
    assert make(_linear(bias=False, dtype=dtype))(x.to(dtype)[:0]).shape == (0, 7, 80)


@pytest.mark.parametrize("make, dtype", [(Int8DynamicLinear, torch.float32), (Int8WeightLinear, torch.bfloat16)])
def test_quantized_linear_rows_are_bit_identical_alone_and_in_any_batch(make, dtype):
    layer = make(_linear(dtype=dtype))
    x = torch.randn(16, 96).to(dtype)
    batch = layer(x)
    for m in (1, 2, 3, 5, 16):
        assert torch.equal(layer(x[:m]), batch[:m])
    assert torch.equal(layer(x[7:8]), batch[7:8])


def test_per_row_scales_keep_an_outlier_batch_mate_from_changing_other_rows():
    layer = Int8DynamicLinear(_linear())
    x = torch.randn(2, 96)
    outlier = x.clone()
    outlier[1, 5] = 1e4  # one huge activation in the batch-mate
    assert torch.equal(layer(outlier)[0], layer(x[:1])[0])
    # what a per-tensor scale would do: row 0 is crushed to a few levels and its result moves
    _, row_scale = quantize_rows(outlier)
    per_tensor = (outlier[0] / row_scale.max()).round().clamp(-127, 127) * row_scale.max()
    per_row = (outlier[0] / row_scale[0]).round().clamp(-127, 127) * row_scale[0]
    assert (per_tensor - outlier[0]).abs().max() > 20 * (per_row - outlier[0]).abs().max()


# ----------------------------------------------------------------------------- whole models, per variant

@pytest.fixture(scope="module", params=PLACEMENTS)
def stages(request, model_source, fp32):
    from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
    from pipeline.embedder import Embedder
    from pipeline.generator import Generator
    from pipeline.reranker import Reranker
    device, variant = request.param
    placement = Placement(device, LOAD_DTYPE[variant], variant)
    if placement == fp32:  # the session's float32 models (conftest): the same load, done once
        names = {"embed": "embedder", "rerank": "reranker", "generate": "generator", "sentiment": "sentiment",
                 "toxicity": "toxicity"}
        return {"variant": variant, "alone": {},
                **{stage: request.getfixturevalue(name) for stage, name in names.items()}}
    return {"variant": variant, "alone": {}, "embed": Embedder.load(model_source, placement),
            "rerank": Reranker.load(model_source, placement), "generate": Generator.load(model_source, placement),
            "sentiment": SentimentClassifier.load(model_source, placement),
            "toxicity": ToxicityClassifier.load(model_source, placement)}


def test_every_linear_is_converted_and_the_lm_head_untied(stages):
    variant = stages["variant"]
    for stage in ("embed", "rerank", "generate", "sentiment", "toxicity"):
        model = stages[stage].model
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        quantized = [m for m in model.modules() if isinstance(m, QUANTIZED_LINEARS)]
        assert (not linears and quantized) if variant.startswith("int") else (linears and not quantized), stage
        if variant == "int4-weight":  # int4 wherever the kernel takes the shape, int8 weight-only elsewhere
            assert any(isinstance(m, Int4WeightLinear) for m in quantized), stage
        if variant == "int4-dynamic":  # int4 wherever a group divides the inputs, int8-dynamic elsewhere
            assert any(isinstance(m, Int4DynamicLinear) for m in quantized), stage
        assert all(type(m) in (RowInvariantLinear, PackedBf16Linear) for m in linears), stage
        params = {p.dtype for p in model.parameters()}
        assert params == {getattr(torch, LOAD_DTYPE[variant])}, stage
        configs = [m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
        assert configs and {c._attn_implementation for c in configs} == {BATCH_INVARIANT_ATTENTION}, stage
    llm = stages["generate"].model
    if variant.startswith("int"):
        assert isinstance(llm.lm_head, QUANTIZED_LINEARS)
        assert llm.lm_head.out_features == llm.config.vocab_size
        assert not llm.config.tie_word_embeddings
    assert stages["generate"].placement.precision == variant


def test_embeddings_alone_equal_embeddings_in_a_batch(stages):
    embedder = stages["embed"]
    texts = QUERIES + ["hi", "A much longer question about refunds, shipping and billing " * 6]
    assert len({len(embedder.model.tokenize([t])["input_ids"][0]) for t in texts}) > 2  # padded batches
    batch = embedder.embed(texts)
    single = np.stack([embedder.embed([t])[0] for t in texts])
    assert batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, rtol=1e-5)
    assert np.array_equal(batch, single)
    assert np.array_equal(embedder.embed(texts[::-1])[::-1], single)  # other batch-mates, other places


def _docs(n: int, long: bool = False) -> tuple[Document, ...]:
    body = "Refunds are issued to the original payment method within 5 business days. " * (8 if long else 1)
    return tuple(Document(i, f"Document {i}", f"{body} Case {i}.", "billing") for i in range(n))


def test_rerank_scores_alone_equal_scores_in_a_batch(stages):
    reranker = stages["rerank"]
    requests = [RerankRequest(QUERIES[0], _docs(10)), RerankRequest(QUERIES[1], _docs(6, long=True)),
                RerankRequest(QUERIES[2], _docs(3))]
    pairs = [(r.query, d.content) for r in requests for d in r.documents]
    alone = [reranker.score_pairs([pair])[0] for pair in pairs]
    grouped = reranker.score_pairs(pairs)  # forwards grouped by length
    saved = reranker.max_pad_ratio
    try:
        reranker.max_pad_ratio = float("inf")  # one padded forward: the strongest batch-mate effect
        padded = reranker.score_pairs(pairs)
        batch = reranker.rerank(requests)
    finally:
        reranker.max_pad_ratio = saved
    assert len(set(len(ids) for ids in reranker.encode_pairs(pairs)["input_ids"])) > 1
    assert grouped == alone and padded == alone
    for b, r in zip(batch, requests):
        assert [(x.document.doc_id, x.score) for x in b] == [(x.document.doc_id, x.score)
                                                             for x in reranker.rerank([r])[0]]


def test_classifiers_alone_equal_classifiers_in_a_batch(stages):
    sentiment, toxicity = stages["sentiment"], stages["toxicity"]
    assert sentiment.classify(TEXTS) == [sentiment.classify([t])[0] for t in TEXTS]
    assert toxicity.classify(TEXTS) == [toxicity.classify([t])[0] for t in TEXTS]
    for classifier in (sentiment, toxicity):
        single = torch.cat([classifier.logits([t]) for t in TEXTS])
        assert torch.equal(classifier.logits(TEXTS), single)
        assert torch.equal(classifier.logits(TEXTS[::-1]).flip(0), single)
    assert toxicity.top_probabilities(TEXTS) == [toxicity.top_probabilities([t])[0] for t in TEXTS]


GEN_REQUESTS = [GenerationRequest(q, _docs(i % 3)) for i, q in enumerate(QUERIES[:4])]


def test_generated_ids_alone_equal_ids_among_same_length_batch_mates(stages):
    generator = stages["generate"]
    for request in GEN_REQUESTS:
        prompt = generator.prompt_ids(request.query, request.documents)
        alone = generator.generate_ids([prompt], max_new_tokens=24)[0]
        assert generator.generate_ids([prompt] * 3, max_new_tokens=24) == [alone] * 3


def _alone(stages, requests) -> list[str]:
    """Each request's text generated alone (the reference), once a variant: several tests compare against it."""
    texts = stages["alone"]
    for request in requests:
        if request not in texts:
            texts[request] = stages["generate"].generate([request])[0]
    return [texts[request] for request in requests]


def _continuous_texts(generator, requests, join_every: int = 9, max_batch: int = 3, graphs: bool = True,
                      prefill_chunk: int = 32) -> list[str]:
    """The engine's answers with each request joining `join_every` decode steps after the previous one;
    on CUDA with its steps replayed from CUDA graphs (checked), or eager (`graphs` False)."""
    engine = ContinuousEngine(generator, max_batch=max_batch, kv_cache_tokens=8192, prefill_chunk=prefill_chunk)
    recorded = engine.runner.graphs
    if not graphs:
        engine.runner.graphs = None
    texts = [generator.completion(seq.generated).text for seq in run_joining(engine, requests, join_every)]
    if graphs and generator.placement.device == "cuda":
        assert recorded is not None and len(recorded.graphs) > 1  # rows bucketed 1, 2, 4 as requests joined
    return texts


def test_generated_text_alone_equals_text_among_mixed_length_batch_mates(stages):
    generator = stages["generate"]
    alone = _alone(stages, GEN_REQUESTS)
    assert generator.generate(GEN_REQUESTS) == alone
    assert _continuous_texts(generator, GEN_REQUESTS) == alone
    if generator.placement.device == "cuda":  # the eager steps the graphs recorded, too
        assert _continuous_texts(generator, GEN_REQUESTS, graphs=False) == alone


# Six prompts of 1-3 documents, long and short, joining one per step: several prompts prefill at once
# and share an iteration's prefill budget (where they were once cut at each other's leftovers).
CROWDED = [GenerationRequest(q, _docs(1 + i % 3, long=i % 2 == 0)) for i, q in enumerate(QUERIES[:6])]


def test_a_prompt_cut_where_its_last_token_would_be_a_chunk_of_its_own_generates_as_alone(stages):
    """The engine's last chunk takes that token with it: one query would attend as a decode step does (on CUDA the
    two kernels round apart)."""
    generator = stages["generate"]
    chunk = 16
    request = next(r for r in GEN_REQUESTS + CROWDED if len(generator.request_ids(r)) % chunk == 1
                   and len(generator.request_ids(r)) > 2 * chunk)
    engine = ContinuousEngine(generator, max_batch=2, kv_cache_tokens=8192, prefill_chunk=chunk)
    (seq,) = run_joining(engine, [request], 1)
    assert [generator.completion(seq.generated).text] == _alone(stages, [request])


@pytest.mark.parametrize("chunk", [4, 10, 37])
def test_the_text_does_not_follow_the_prefill_chunk_size(stages, chunk):
    """The engine prefills at the multiples of GENERATE_PREFILL_CHUNK, the reference whole: sizes whose cuts once
    changed the weight-only variants' text (the CPU's prompt attention rounded by where a prompt was cut)."""
    generator = stages["generate"]
    texts = _continuous_texts(generator, GEN_REQUESTS[:2], join_every=1, max_batch=2, prefill_chunk=chunk)
    assert texts == _alone(stages, GEN_REQUESTS[:2])


def test_generated_text_alone_equals_text_when_prompts_prefill_side_by_side(stages):
    generator = stages["generate"]
    assert _continuous_texts(generator, CROWDED, join_every=1, max_batch=6) == _alone(stages, CROWDED)


def test_next_token_logits_alone_are_bit_identical_in_a_left_padded_batch(stages):
    """The root of the invariance: not just the same argmax, the same logits to the last bit."""
    generator = stages["generate"]
    prompts = [generator.prompt_ids(r.query, r.documents) for r in GEN_REQUESTS]
    model = generator.model

    def last_logits(rows):
        inputs = {name: t.to(model.device) for name, t in generator.tokens.left_padded(rows).items()}
        positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # as generate() counts them
        with torch.inference_mode():
            return model(**inputs, position_ids=positions, logits_to_keep=1).logits[:, -1]

    batch = last_logits(prompts)
    assert len({len(p) for p in prompts}) > 1  # the batch is padded
    for row, prompt in enumerate(prompts):
        assert torch.equal(last_logits([prompt])[0], batch[row]), row


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), pytest.param("cpu", torch.bfloat16, marks=BF16_CPU)] + [
    pytest.param("cuda", getattr(torch, v), marks=ON_CUDA) for v in CUDA_VARIANTS])
@pytest.mark.parametrize("k, n", [(4864, 512), (768, 3072), (64, 32), (32, 1)])
def test_float_linear_gives_a_row_the_same_bits_at_any_row_count(dtype, k, n, device):
    """(4864, 512): wide as Qwen2.5-0.5B's down_proj (oneDNN sums a lone bf16 row another way);
    (768, 3072): bert-base's up-projection (MKL's float32 GEMM sums rows by row count);
    (64, 32): small enough that bf16 F.linear leaves it to a native kernel; (32, 1): a score head."""
    from pipeline.kernels.batch_invariance import make_linears_row_invariant
    torch.manual_seed(0)
    not_offered = torch.float16 if device == "cpu" else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(k, n).to(dtype), torch.nn.Linear(4, 4).to(not_offered)).to(device)
    assert make_linears_row_invariant(model) == 1  # the Linear in a dtype the device is not offered in is left alone
    layer = model[0]
    assert type(layer) in (RowInvariantLinear, PackedBf16Linear) and type(model[1]) is torch.nn.Linear
    x = torch.randn(600, k).to(dtype).to(device)
    with torch.no_grad():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
        for rows in (2, 3, 5, 17, 64, 600):
            for start in (0, 3):
                got = layer(x[start:start + rows])[:40 - start]
                assert torch.equal(got, alone[start:start + got.shape[0]]), (rows, start)
        assert layer(x[:6].reshape(2, 3, k)).shape == (2, 3, n)
        assert layer(x[:0]).shape == (0, n)


def test_int8_dynamic_is_offered_on_the_cpu_only_where_it_sums_exactly():
    from pipeline.cpu_features import cpu_sums_int8_exactly
    assert cpu_sums_int8_exactly({"avx2", "avx512_vnni"}) and cpu_sums_int8_exactly({"avx2", "avx_vnni"})
    assert cpu_sums_int8_exactly({"avx2", "fma"})  # AVX2 only: the project's AVX2 kernel
    assert not cpu_sums_int8_exactly({"sse4_2", "avx"})
    plain = {"bf16": False, "int8_cpu": lambda: False}
    with pytest.raises(ConfigError, match="EMBED_PRECISION='int8-dynamic' is not valid on the CPU"):
        _placement({"EMBED_PRECISION": "int8-dynamic"}, "embed", **plain)
    # int4-dynamic's activations are int8-dynamic's: offered with it or not at all
    with pytest.raises(ConfigError, match=r"^GENERATE_PRECISION='int4-dynamic' is not valid on the CPU: expected auto, "
                                          r"fast, float32, bfloat16, int8-weight, int4-weight$"):
        _placement({"GENERATE_PRECISION": "int4-dynamic"}, "generate", **plain)
    assert _placement({"GENERATE_PRECISION": "int4-dynamic"}, "generate") == Placement("cpu", "float32", "int4-dynamic")
    # fast's int8 entries fall back to auto's choice there: float32 on a CPU without bf16
    assert {_placement({"PRECISION": "fast"}, s, **plain).precision for s in FAST["cpu"]} <= {"float32", "int8-weight"}
    assert _placement({"PRECISION": "fast"}, "generate", bf16=False, int8_cpu=lambda: True).precision == "int8-dynamic"


def test_bfloat16_is_offered_on_the_cpu_only_where_onednn_packs_its_weights():
    from pipeline.cpu_features import cpu_packs_bf16
    assert cpu_packs_bf16({"avx512f", "avx512bw", "avx512vl", "avx512dq"}) and cpu_packs_bf16({"avx2", "avx_ne_convert"})
    assert not cpu_packs_bf16({"avx2", "fma"})
    with pytest.raises(ConfigError, match="PRECISION='bfloat16' is not valid on the CPU"):
        _placement({"PRECISION": "bfloat16"}, "embed", bf16=False, packs_bf16=lambda: False)
    assert _placement({"PRECISION": "int8-weight"}, "embed", bf16=False, packs_bf16=lambda: False).precision == "int8-weight"


def test_int4_weight_is_offered_on_the_cpu_only_where_its_kernel_has_a_vector_path():
    from pipeline.cpu_features import cpu_runs_int4
    assert cpu_runs_int4({"avx2", "fma", "avx512f"}) and not cpu_runs_int4({"sse4_1", "avx"})
    with pytest.raises(ConfigError, match=r"^GENERATE_PRECISION='int4-weight' is not valid on the CPU: expected "
                                          r"auto, fast, float32, bfloat16, int8-dynamic, int8-weight, int4-dynamic$"):
        _placement({"GENERATE_PRECISION": "int4-weight"}, "generate", int4_cpu=lambda: False)
    assert _placement({"GENERATE_PRECISION": "int4-weight"}, "generate") == Placement("cpu", "bfloat16", "int4-weight")
