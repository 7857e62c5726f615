"""Every stage: a batch gives what one item at a time gives (float32, tiny stand-ins)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline import spec
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest
from pipeline.reranker import RerankRequest, length_groups

QUERIES = list(spec.REFERENCE_QUERIES)
TEXTS = ["ok", "Answer: you can return it within 30 days for a refund.",
         "Answer: " + "the package is delayed because of the weather and the carrier. " * 20]


def _docs(n: int, long: bool = False) -> tuple[Document, ...]:
    body = "Refunds are issued to the original payment method within 5 business days. " * (8 if long else 1)
    return tuple(Document(i, f"Document {i}", f"{body} Case {i}.", "billing") for i in range(n))


def test_embeddings_batch_equals_single(embedder):
    batch = embedder.embed(QUERIES)
    single = np.stack([embedder.embed([q])[0] for q in QUERIES])
    assert batch.shape == (8, spec.EMBED_DIM) and batch.dtype == np.float32
    np.testing.assert_allclose(batch, single, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, rtol=1e-5)
    assert [v.shape for v in embedder(QUERIES[:2])] == [(768,), (768,)]


def test_rerank_batch_equals_single_with_mixed_lengths(reranker):
    requests = [RerankRequest(QUERIES[0], _docs(10)), RerankRequest(QUERIES[1], _docs(10, long=True)),
                RerankRequest(QUERIES[2], _docs(3)), RerankRequest(QUERIES[3], ())]
    batch = reranker.rerank(requests)
    single = [reranker.rerank([r])[0] for r in requests]
    for b, s, r in zip(batch, single, requests):
        assert [x.document.doc_id for x in b] == [x.document.doc_id for x in s]
        np.testing.assert_allclose([x.score for x in b], [x.score for x in s], rtol=1e-4, atol=1e-5)
        assert sorted(x.document.doc_id for x in b) == sorted(d.doc_id for d in r.documents)
        assert all(b[i].score >= b[i + 1].score for i in range(len(b) - 1))


def test_length_groups_cover_every_pair_once_and_bound_padding():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(5, 513, size=int(rng.integers(0, 40))).tolist()
        max_pairs, ratio = int(rng.integers(1, 12)), float(rng.choice([1.0, 1.1, 1.5]))
        groups = length_groups(lengths, max_pairs, ratio)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert 1 <= len(g) <= max_pairs
            if len(g) > 1:  # a lone pair has no padding to bound
                assert len(g) * max(lengths[i] for i in g) <= ratio * sum(lengths[i] for i in g) + 1e-9
        # shortest first: every group's pairs are no longer than the next group's
        assert all(max(lengths[i] for i in a) <= min(lengths[i] for i in b) for a, b in zip(groups, groups[1:]))


def test_length_groups_examples():
    assert length_groups([], 32, 1.1) == []
    assert length_groups([100, 100, 100], 32, 1.0) == [[0, 1, 2]]  # equal lengths: no padding, one forward
    assert length_groups([100, 100, 100], 2, 1.0) == [[0, 1], [2]]
    assert length_groups([200, 100, 105, 400], 32, 1.1) == [[1, 2], [0], [3]]
    assert length_groups([200, 100, 105, 400], 32, float("inf")) == [[1, 2, 0, 3]]  # the old one forward


def test_rerank_scores_do_not_depend_on_how_pairs_are_grouped(reranker):
    pairs = [(QUERIES[i % 8], d.content) for i, d in enumerate(_docs(4) + _docs(4, long=True) + _docs(2))]
    saved = reranker.max_pad_ratio
    try:
        reranker.max_pad_ratio = float("inf")
        one_forward = reranker.score_pairs(pairs)
        reranker.max_pad_ratio = 1.0
        grouped = reranker.score_pairs(pairs)
    finally:
        reranker.max_pad_ratio = saved
    assert len(length_groups([len(ids) for ids in reranker.encode_pairs(pairs)["input_ids"]], 32, 1.0)) > 1
    np.testing.assert_allclose(grouped, one_forward, rtol=1e-4, atol=1e-5)


def test_generate_batch_equals_single_left_padded(generator):
    requests = [GenerationRequest(QUERIES[0], _docs(3)), GenerationRequest(QUERIES[1], _docs(1, long=True)),
                GenerationRequest(QUERIES[2], ()), GenerationRequest("Hi", _docs(3, long=True))]
    lengths = {len(generator.prompt_ids(r.query, r.documents)) for r in requests}
    assert len(lengths) == len(requests), "the batch must mix prompt lengths to exercise left padding"
    batch = generator.generate(requests)
    single = [generator.generate([r])[0] for r in requests]
    assert batch == single
    assert all(isinstance(t, str) and t for t in batch)


def test_generate_stops_at_128_new_tokens(generator):
    inputs = generator.tokens.left_padded([generator.prompt_ids(QUERIES[0], _docs(3))])
    out = generator.model.generate(**inputs, generation_config=generator.generation_config)
    assert out.shape[1] - inputs["input_ids"].shape[1] <= spec.MAX_NEW_TOKENS
    assert generator.generation_config.do_sample is False
    assert generator.generation_config.repetition_penalty == pytest.approx(1.1)


def test_prompt_is_the_chat_template_of_the_spec_messages(generator):
    docs = _docs(4)
    text = generator.prompt(QUERIES[0], docs)
    assert spec.SYSTEM_PROMPT in text
    assert spec.build_context(docs) in text and "Document 3" not in text
    assert text.rstrip().endswith("<|im_start|>assistant")


def test_classifiers_batch_equals_single(sentiment, toxicity):
    labels = sentiment.classify(TEXTS)
    assert labels == [sentiment.classify([t])[0] for t in TEXTS]
    assert set(labels) <= set(spec.SENTIMENTS)
    flags = toxicity.classify(TEXTS)
    assert flags == [toxicity.classify([t])[0] for t in TEXTS]
    assert set(flags) <= {"true", "false"}
    probs = toxicity.top_probabilities(TEXTS)
    assert flags == [("true" if p > 0.5 else "false") for p in probs]


def test_classifiers_see_only_512_characters(sentiment, toxicity):
    long = "Answer: great service. " * 100
    assert toxicity.top_probabilities([long]) == pytest.approx(toxicity.top_probabilities([long[:512]]))
    assert sentiment.classify([long]) == sentiment.classify([long[:512]])
    assert sentiment.classify([]) == [] and toxicity.classify([]) == []


def test_devices_name_each_model_stage_device_and_precision(embedder, reranker, generator, sentiment, toxicity):
    from pipeline.device import Placement
    from pipeline.stages import Stages
    stages = Stages(embedder, reranker, generator, sentiment, toxicity)
    assert stages.devices() == {str(stage): "cpu/float32" for stage in spec.MODEL_STAGES}
    saved = generator.placement
    try:
        generator.placement = Placement("cpu", "float32", "int8-dynamic")
        assert stages.devices()["generate"] == "cpu/int8-dynamic"
    finally:
        generator.placement = saved


def test_warm_up_drives_the_engine_that_serves_and_leaves_it_idle_and_ready(embedder, reranker, generator, sentiment,
                                                                            toxicity, monkeypatch):
    import torch

    from pipeline.continuous import ContinuousEngine
    from pipeline.stages import Stages
    if torch.cuda.is_available():
        pytest.skip("the CPU case: off CUDA nothing is recorded (test_warm_up_records_every_cuda_graph covers CUDA)")
    stages = Stages(embedder, reranker, generator, sentiment, toxicity)
    engine = ContinuousEngine(generator, max_batch=3, kv_cache_tokens=4096, prefill_chunk=64)

    def refused(*args, **kwargs):
        raise AssertionError("the warm-up ran Hugging Face generate, which does not serve")

    monkeypatch.setattr(generator, "generate_ids", refused)
    stages.warm_up(engine)
    stats = engine.stats()
    assert not engine.has_work() and engine.runner.table.rows == [] and stats.running_sequences == 0
    assert engine.runner.table.keys  # the slots' buffers, allocated once by the warm-up's prefill
    assert (stats.cuda_graphs_recorded, stats.cuda_graphs_failed) == (0, 0)  # no graphs on the CPU
    monkeypatch.undo()
    request = GenerationRequest(QUERIES[1], _docs(2), max_new_tokens=12)
    seq = engine.add(request)
    while engine.has_work():
        assert not engine.step().failed
    assert generator.completion(seq.generated).text == generator.generate([request])[0]


def test_warm_up_records_every_cuda_graph_of_the_usual_layout_before_serving(model_source):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: CUDA graphs are recorded only on CUDA")
    from pipeline.continuous import ContinuousEngine
    from pipeline.continuous.cuda_graphs import row_buckets
    from pipeline.device import Placement
    from pipeline.generator import Generator
    from pipeline.kernels.chunked_attention import CHUNK
    generator = Generator.load(model_source, Placement("cuda", "bfloat16", "bfloat16"))
    engine = ContinuousEngine(generator, max_batch=8, kv_cache_tokens=8 * 3 * CHUNK, prefill_chunk=64)
    engine.warm_up([GenerationRequest(QUERIES[0], (), max_new_tokens=2)])
    stats = engine.stats()
    # every rows bucket (1, 2, 4, 8) at every width (1 to 3 chunks), and none failed
    assert (stats.cuda_graphs_recorded, stats.cuda_graphs_failed) == (len(row_buckets(8)) * 3, 0)
    request = GenerationRequest(QUERIES[1], _docs(2), max_new_tokens=12)
    seq = engine.add(request)
    while engine.has_work():
        assert not engine.step().failed
    assert engine.stats().cuda_graphs_recorded == len(row_buckets(8)) * 3  # served from the recorded grid
    assert len(seq.generated) > 0
